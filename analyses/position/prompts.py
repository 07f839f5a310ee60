"""Prompt builders for the position sweep (Liu et al. 2023, "Lost in the Middle").

A *sweep* is one example rendered once per gold position: the same items (key-value pairs,
documents, sentences) in the same order, with only the gold item moved to slot p. Prompts are
assembled from pieces tokenized separately (head, per-slot label, items, separators, tail) and
concatenated as token ids, so that moving the gold item permutes whole token chunks: every other
token stays fixed and all rows of a sweep have the same length, for any tokenizer.

Builders:
- `zoo_kv_sweeps`: the zoo's kv format (`<bos> k17 v03 ; k44 v17 ; ... ; k44`), pairs drawn by
  the zoo generator (`models/zoo/data.py`), word-level zoo vocabulary.
- `kv_sweeps`: Liu et al.'s key-value retrieval, a JSON object of k UUID pairs in their prompt
  ("Extract the value corresponding to the specified key ..."). One deviation: a space after
  "{" (`{ "k": "v",\\n "k": "v"}`) so that every record tokenizes identically in every slot.
  `fit_kv_sweeps` picks k (and, for small contexts, shorter hex keys) to fit the context.
- `word_kv_sweeps`: the zoo's kv format over words that are one token under the model's tokenizer
  (`vocab_words`), for a tokenizer that cannot write Liu et al.'s JSON prompt (`json_kv_gap`: UUID keys
  need digits and '-'), as heads' IOI default draws names that are single tokens.
- `records.py` holds the builders over records: `qa_sweeps` (multi-document QA) and
  `retrieval_sweeps` (encoders).

Query-aware contextualisation (`query_aware=True`) puts the query before the data as well.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from headscope.errors import ConfigError

KV_INSTRUCTION = "Extract the value corresponding to the specified key in the JSON object below."


@dataclass(frozen=True, kw_only=True)
class PositionSweep:
    """One example at every gold position; row i has the gold item in slot positions[i] (1-based).

    tokens:       [n_pos, pos] int64 prompts, ending where the answer starts.
    gold_spans:   [n_pos, 2] int64 half-open token range of the gold item in each row.
    answer_ids:   [n_answer] int64 token ids of the answer continuation (decoders; empty for encoders).
    answers:      accepted answer strings (accuracy: one is a substring of the greedy output).
    query_tokens: [1, q_pos] int64, encoders only: the query, encoded on its own.
    values:       every value the context holds, the gold's first (copy tasks: kv, json_kv, word_kv; empty for
                  QA): the outputs that copy one of them tell "prefers a wrong value" from "does not do the task".
    no_gold_tokens: [1, pos'] int64, the same prompt with the gold item taken out (the same distractors in the same
                  order, slot labels 1..n-1): Liu et al.'s no-gold / closed-book baseline. None on a sweep built by
                  hand without it (no baseline is measured then).
    """

    tokens: torch.Tensor
    gold_spans: torch.Tensor
    positions: tuple[int, ...]
    n_items: int
    answer_ids: torch.Tensor
    answers: tuple[str, ...]
    query_tokens: torch.Tensor | None = None
    values: tuple[str, ...] = ()
    no_gold_tokens: torch.Tensor | None = None

    @property
    def prompt_len(self) -> int:
        return int(self.tokens.shape[1])


def default_positions(n_items: int) -> tuple[int, ...]:
    """The gold-position grid: every slot for up to 8 items, else 1 and the quarters (1,5,10,15,20 of 20)."""
    if n_items < 1:
        raise ConfigError(f"n_items must be >= 1, got {n_items}.")
    if n_items <= 8:
        return tuple(range(1, n_items + 1))
    return tuple(sorted({1, *(int(n_items * k / 4 + 0.5) for k in range(1, 5))}))


def check_positions(positions: Sequence[int] | None, n_items: int) -> tuple[int, ...]:
    """Validate a 1-based gold-position grid against n_items (None: `default_positions`)."""
    if positions is None:
        return default_positions(n_items)
    grid = tuple(int(p) for p in positions)
    bad = [p for p in grid if not 1 <= p <= n_items]
    if not grid or bad:
        raise ConfigError(
            f"gold positions must be a non-empty list of slots in 1..{n_items} (1-based), got {list(positions)}; "
            f"e.g. positions=(1, {max(1, n_items // 2)}, {n_items})."
        )
    return grid


# ------------------------------------------------------------------------- assembly
def special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer adds before and after a text ([CLS] / [SEP] for BERT)."""
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return list(full[:i]), list(full[i + len(plain):])
    return [], []


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of one piece, no special tokens; raises if a word-level tokenizer maps it to <unk>."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
    unk, unk_text = getattr(tokenizer, "unk_token_id", None), getattr(tokenizer, "unk_token", None)
    if unk is not None and unk in ids and not (unk_text and unk_text in text):
        raise ConfigError(
            f"the tokenizer maps part of {text[:60]!r} to its unknown token; position's sweep 'word_kv' builds "
            f"key-value prompts from the tokenizer's own words, and `headscope position --model M --task QA.jsonl` "
            f"runs multi-document QA over text it can encode."
        )
    return ids


def item_sweep(
    tokenizer: Any,
    *,
    items: Sequence[str],
    gold: str,
    positions: Sequence[int] | None,
    head: str = "",
    tail: str = "",
    sep: str = "",
    slot_label: Callable[[int], str] | None = None,
    answer: str = "",
    answers: Sequence[str] = (),
    encoder: bool = False,
    query: str | None = None,
    prepend_bos: bool = True,
    values: Sequence[str] = (),
) -> PositionSweep:
    """Render `gold` at each slot among the distractor `items` (kept in their order).

    Layout: specials, head, then for slot i = 1..n: slot_label(i), item, sep (not after the last),
    then tail. Each piece is tokenized on its own; decoders get the tokenizer's BOS in front (prepend_bos=False:
    only where the tokenizer adds it itself, as to_tokens under load_model(..., prepend_bos=False)).
    `answer` is the continuation scored by teacher forcing; `answers` the strings accepted by
    accuracy (default: the answer stripped of spaces and quotes); `values` every value of the context (copy tasks).
    """
    n_items = len(items) + 1
    grid = check_positions(positions, n_items)
    prefix, suffix = special_affixes(tokenizer)
    bos = getattr(tokenizer, "bos_token_id", None)
    if not encoder:
        suffix = []
        if prepend_bos and bos is not None and prefix[:1] != [bos]:
            prefix = [bos, *prefix]
    head_ids, tail_ids, sep_ids = encode(tokenizer, head), encode(tokenizer, tail), encode(tokenizer, sep)
    labels = [encode(tokenizer, slot_label(i + 1)) if slot_label else [] for i in range(n_items)]
    chunks = [encode(tokenizer, it) for it in items]
    gold_ids = encode(tokenizer, gold)
    if not gold_ids:
        raise ConfigError("the gold item tokenizes to nothing; pass a non-empty gold item.")
    answer_ids = encode(tokenizer, answer) if answer else []
    accepted = tuple(answers) or ((answer.strip().strip('"').strip(),) if answer else ())
    query_tokens = None
    if query is not None:
        start, end = special_affixes(tokenizer)
        query_tokens = torch.tensor([[*start, *encode(tokenizer, query), *end]])  # [1, q_pos]
    return _assemble(grid, [*prefix, *head_ids], labels, chunks, gold_ids, sep_ids, [*tail_ids, *suffix],
                     answer_ids, accepted, query_tokens, values=tuple(values))


def _assemble(grid: tuple[int, ...], head: list[int], labels: Sequence[list[int]], chunks: Sequence[list[int]],
              gold: list[int], sep: list[int], tail: list[int], answer: list[int], answers: tuple[str, ...],
              query_tokens: torch.Tensor | None = None, values: tuple[str, ...] = ()) -> PositionSweep:
    """The sweep of token-id pieces: for each slot p of `grid`, head, then the items with `gold` at slot p
    (each after its slot label, `sep` between them), then tail; and the no-gold prompt, the same pieces
    without the gold item."""
    n_items = len(chunks) + 1
    rows, spans = [], []

    def render(order: Sequence[list[int]], p: int | None) -> list[int]:
        ids = list(head)
        for i, chunk in enumerate(order):
            ids += labels[i]
            if i == p:
                spans.append((len(ids), len(ids) + len(chunk)))
            ids += chunk
            if i < len(order) - 1:
                ids += sep
        return [*ids, *tail]

    for p in grid:
        rows.append(render([*chunks[: p - 1], gold, *chunks[p - 1:]], p - 1))
    no_gold = render(list(chunks), None)  # the distractors alone, in their order
    return PositionSweep(
        tokens=torch.tensor(rows, dtype=torch.int64),  # [n_pos, pos]
        gold_spans=torch.tensor(spans, dtype=torch.int64),  # [n_pos, 2]
        positions=grid,
        n_items=n_items,
        answer_ids=torch.tensor(answer, dtype=torch.int64),  # [n_answer]
        answers=answers,
        query_tokens=query_tokens,
        values=values,
        no_gold_tokens=torch.tensor([no_gold], dtype=torch.int64),  # [1, pos']
    )


# --------------------------------------------------------------------------- zoo kv
def zoo_kv_sweeps(
    tokenizer: Any, *, n_pairs: int = 20, n_examples: int = 16, seed: int = 0,
    positions: Sequence[int] | None = None, query_aware: bool = False, prepend_bos: bool = True,
) -> list[PositionSweep]:
    """The zoo's kv task at every gold position: `<bos> k v ; ... ; k v ; kq` -> vq.

    Pairs come from the zoo generator (data.kv_example); the queried pair is taken out and
    re-inserted at each slot, the other pairs keep their order. query_aware adds kq after <bos>.
    """
    from headscope.models.zoo import data

    rng = np.random.default_rng([seed, data.TASKS.index("kv")])
    sweeps = []
    for _ in range(n_examples):
        ex = data.kv_example(rng, n_pairs=n_pairs)
        words = ex.prompt[1:-1]  # k v ; k v ; ...
        pairs = [f"{words[3 * i]} {words[3 * i + 1]}" for i in range(n_pairs)]
        q = (ex.spans["gold"][0] - 1) // 3
        key = ex.prompt[-1]
        sweeps.append(item_sweep(
            tokenizer, items=[*pairs[:q], *pairs[q + 1:]], gold=pairs[q], positions=positions,
            head=key if query_aware else "", sep=data.vocab.SEP, tail=f"{data.vocab.SEP} {key}",
            answer=ex.answer, answers=(ex.answer,), prepend_bos=prepend_bos,
            values=(ex.answer, *(words[3 * i + 1] for i in range(n_pairs) if i != q)),
        ))
    return sweeps


# ----------------------------------------------------------------------- Liu et al. kv
def _uuid(rng: np.random.Generator) -> str:
    """A UUID4-shaped string from a seeded generator (8-4-4-4-12 hex digits)."""
    h = "".join(f"{b:02x}" for b in rng.integers(0, 256, size=16))
    h = h[:12] + "4" + h[13:16] + "89ab"[int(rng.integers(4))] + h[17:]
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _hex(rng: np.random.Generator, n: int) -> str:
    """n random hex digits from a seeded generator."""
    return "".join(f"{b:02x}" for b in rng.integers(0, 256, size=(n + 1) // 2))[:n]


def kv_records(rng: np.random.Generator, n_pairs: int, key_chars: int | None = None) -> list[tuple[str, str]]:
    """n_pairs distinct (key, value) pairs: UUIDs, or key_chars random hex digits each."""
    make = _uuid if key_chars is None else (lambda r: _hex(r, key_chars))
    records: dict[str, str] = {}
    while len(records) < n_pairs:
        records[make(rng)] = make(rng)
    return list(records.items())


def kv_prompt_parts(key: str, query_aware: bool, instruction: bool = True) -> tuple[str, str]:
    """(head, tail) of Liu et al.'s kv prompt around the JSON records (instruction: their first line)."""
    question = f'Key: "{key}"'
    head = (f"{KV_INSTRUCTION}\n\n" if instruction else "") + (f"{question}\n\n" if query_aware else "") + "JSON data:\n{"
    return head, f"}}\n\n{question}\nCorresponding value:"


def kv_sweeps(
    tokenizer: Any, *, n_pairs: int = 20, n_examples: int = 16, seed: int = 0,
    positions: Sequence[int] | None = None, query_aware: bool = False, key_chars: int | None = None,
    instruction: bool = True, prepend_bos: bool = True,
) -> list[PositionSweep]:
    """Liu et al.'s synthetic key-value retrieval over k UUID pairs, for any tokenizer (key_chars: hex
    keys and values of that many digits instead; instruction=False: without the instruction line)."""
    if n_pairs < 2:
        raise ConfigError(f"n_pairs must be >= 2, got {n_pairs}.")
    rng = np.random.default_rng([seed, 75])
    sweeps = []
    for _ in range(n_examples):
        records = [f' "{k}": "{v}"' for k, v in kv_records(rng, n_pairs, key_chars)]
        g = int(rng.integers(n_pairs))
        key, value = records[g].split('"')[1], records[g].split('"')[3]
        head, tail = kv_prompt_parts(key, query_aware, instruction)
        try:
            sweeps.append(item_sweep(
                tokenizer, items=[*records[:g], *records[g + 1:]], gold=records[g], positions=positions,
                head=head, tail=tail, sep=",\n", answer=f' "{value}"', answers=(value,), prepend_bos=prepend_bos,
                values=(value, *(r.split('"')[3] for i, r in enumerate(records) if i != g)),
            ))
        except ConfigError as err:  # the text is headscope's own (UUIDs it drew): say whose data it is
            raise ConfigError(f"position's json_kv data (Liu et al.'s key-value prompt, with UUID keys headscope "
                              f"draws) does not fit this tokenizer: {err}") from None
    return sweeps


# The kv formats fit_kv_sweeps tries, longest first: (hex digits of keys and values, None for UUIDs;
# whether the prompt opens with Liu et al.'s instruction).
KV_FORMATS = ((None, True), (8, True), (8, False), (4, False))
MIN_FIT_PAIRS = 3  # a format is used when this many pairs (a middle slot) fit; the last one from 2


def sweep_tokens(sweeps: Sequence[PositionSweep], extra_new_tokens: int = 8) -> int:
    """The most positions a decoder sweep uses: prompt, answer and greedy decoding's extra tokens."""
    return max(sw.prompt_len + sw.answer_ids.numel() + extra_new_tokens for sw in sweeps)


def fit_kv_sweeps(
    tokenizer: Any, n_ctx: int, *, max_pairs: int = 20, n_examples: int = 16, seed: int = 0,
    positions: Sequence[int] | None = None, query_aware: bool = False, extra_new_tokens: int = 8, prepend_bos: bool = True,
) -> list[PositionSweep]:
    """kv_sweeps with the most pairs (up to max_pairs) whose prompts, answers and greedy decoding fit
    n_ctx, in the first of KV_FORMATS where MIN_FIT_PAIRS pairs fit (UUIDs with the instruction for
    any usual context; shorter hex keys, then no instruction line, for small ones)."""
    def build(n: int, key_chars: int | None, instruction: bool) -> list[PositionSweep]:
        return kv_sweeps(tokenizer, n_pairs=n, n_examples=n_examples, seed=seed, positions=positions,
                         query_aware=query_aware, key_chars=key_chars, instruction=instruction, prepend_bos=prepend_bos)

    for i, (key_chars, instruction) in enumerate(KV_FORMATS):
        floor = min(max_pairs, 2 if i == len(KV_FORMATS) - 1 else MIN_FIT_PAIRS)
        smallest = build(floor, key_chars, instruction)
        need_floor = sweep_tokens(smallest, extra_new_tokens)
        if need_floor > n_ctx:
            continue
        n = max_pairs
        while n > floor:
            sweeps = build(n, key_chars, instruction)
            need = sweep_tokens(sweeps, extra_new_tokens)
            if need <= n_ctx:
                return sweeps
            per_pair = max(1.0, (need - need_floor) / (n - floor))  # tokens per extra pair
            n = min(n - 1, floor + int((n_ctx - need_floor) / per_pair))
        return smallest
    raise ConfigError(
        f"not even two key-value pairs of {KV_FORMATS[-1][0]} hex digits fit the context of {n_ctx} tokens; "
        "pass a custom list of PositionSweep."
    )


def kv_sweeps_in_context(tokenizer: Any, n_ctx: int, *, n_pairs: int, extra_new_tokens: int = 8,
                         **kwargs: Any) -> list[PositionSweep]:
    """kv_sweeps of exactly n_pairs pairs in the first of KV_FORMATS whose prompts, answers and greedy decoding
    fit n_ctx: Liu et al.'s UUIDs wherever they fit, else the format fit_kv_sweeps picks for this context (so a
    budget's cut of a fitted run's pairs keeps its format and only drops pairs: review 11c A2). UUIDs when no
    format fits (the run then says the prompt is longer than the context)."""
    for key_chars, instruction in KV_FORMATS:
        sweeps = kv_sweeps(tokenizer, n_pairs=n_pairs, key_chars=key_chars, instruction=instruction, **kwargs)
        if sweep_tokens(sweeps, extra_new_tokens) <= n_ctx:
            return sweeps
    return kv_sweeps(tokenizer, n_pairs=n_pairs, **kwargs)


def is_liu_format(tokenizer: Any, sweeps: Sequence[PositionSweep]) -> bool:
    """Whether json_kv sweeps are Liu et al.'s own format: UUID keys and values, with the instruction."""
    text = tokenizer.decode(sweeps[0].tokens[0], skip_special_tokens=True).lower()
    return len(sweeps[0].answers[0]) == 36 and KV_INSTRUCTION.split()[0].lower() in text


def kv_fit_note(tokenizer: Any, sweeps: Sequence[PositionSweep], n_ctx: int, *, asked: bool = False) -> str:
    """The summary's account of a fit_kv_sweeps choice."""
    value = sweeps[0].answers[0]
    keys = "UUID keys and values" if len(value) == 36 else f"keys and values of {len(value)} hex digits"
    text = tokenizer.decode(sweeps[0].tokens[0], skip_special_tokens=True).lower()
    instruction = "with" if KV_INSTRUCTION.split()[0].lower() in text else "without"
    if asked:  # n_items set (by the user or a budget's cut): the pairs as set, the format chosen to fit
        return (f"{sweeps[0].n_items} pairs as set, {keys}, {instruction} Liu et al.'s instruction: the longest "
                f"format whose prompts fit context {n_ctx}")
    return f"n_pairs chosen to fit context {n_ctx}: {sweeps[0].n_items} pairs, {keys}, {instruction} Liu et al.'s instruction"


_SCANS: weakref.WeakKeyDictionary[Any, dict[tuple, Any]] = weakref.WeakKeyDictionary()  # tokenizer -> {call: result}


def _memo(tokenizer: Any, key: tuple, make: Callable[[], Any]) -> Any:
    """make() once per tokenizer and key (as cost._BUILT caches the built prompts per model): json_kv_gap and
    vocab_words scan the tokenizer, and a run asks them several times (sweep_kind, default_data_gap, build_sweeps,
    word_kv_note). The key holds len(tokenizer), so tokens added later scan again; a tokenizer that cannot be
    weakly referenced is scanned each time."""
    try:
        cache = _SCANS.setdefault(tokenizer, {})
    except TypeError:
        return make()
    key = (*key, len(tokenizer) if hasattr(tokenizer, "__len__") else None)
    if key not in cache:
        cache[key] = make()
    return cache[key]


def json_kv_gap(tokenizer: Any) -> str | None:
    """Why Liu et al.'s kv prompt (instruction, JSON, UUID keys: hex digits and '-') cannot be written with this
    tokenizer, in words ("the digits, '-', '{' and '\\n' become its unknown token"), or None when it can.
    Remembered per tokenizer (_memo)."""
    return _memo(tokenizer, ("json_kv_gap",), lambda: _json_kv_gap(tokenizer))


def kv_floor_tokens(tokenizer: Any, prepend_bos: bool = True, extra_new_tokens: int = 8) -> int:
    """The tokens fit_kv_sweeps' smallest prompts take (2 pairs of KV_FORMATS' last format, with the answer and
    greedy decoding's extra tokens, over 32 seeded examples): a context below it fits no kv prompt. Remembered per
    tokenizer (_memo)."""
    key_chars, instruction = KV_FORMATS[-1]
    return _memo(tokenizer, ("kv_floor", prepend_bos, extra_new_tokens), lambda: sweep_tokens(kv_sweeps(
        tokenizer, n_pairs=2, n_examples=32, positions=(1,), key_chars=key_chars, instruction=instruction,
        prepend_bos=prepend_bos), extra_new_tokens))


def _json_kv_gap(tokenizer: Any) -> str | None:
    try:
        kv_sweeps(tokenizer, n_pairs=2, n_examples=1, positions=(1,))
    except ConfigError as err:
        unk = getattr(tokenizer, "unk_token_id", None)
        head, tail = kv_prompt_parts("0123456789abcdef-", False)
        text = f'{head} "a": "b",\n{tail}'  # letters alone say nothing of a word-level vocabulary: the others
        chars = sorted({c for c in text if not c.isalpha() and unk in tokenizer(c, add_special_tokens=False)["input_ids"]})
        if not chars:
            return str(err)
        digits = [c for c in chars if c.isdigit()]
        named = (["the digits"] if len(digits) == 10 else [repr(c) for c in digits]) + [repr(c) for c in chars
                                                                                         if not c.isdigit()]
        return f"{', '.join(named[:-1]) + ' and ' + named[-1] if len(named) > 1 else named[0]} become its unknown token"
    return None


# -------------------------------------------------------------- kv over the tokenizer's words
WORD_SEPARATORS = (" ;", ";", " ,", ",", " .", ".", " |", "|")  # the first that is one known token separates pairs


def _one_token(tokenizer: Any, text: str, avoid: set[int]) -> int | None:
    """The id `text` is, when it tokenizes alone to exactly one token that is neither unknown nor in `avoid`."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    unk = getattr(tokenizer, "unk_token_id", None)
    return ids[0] if len(ids) == 1 and ids[0] != unk and ids[0] not in avoid else None


def vocab_words(tokenizer: Any, d_vocab: int | None = None, limit: int = 64) -> list[tuple[str, int]]:
    """(word, id) for up to `limit` of the tokenizer's pieces that are a whole word of two or more letters and
    one token on their own after a space (" word" -> [id], as each item of a sweep is tokenized), in id order:
    the keys and values `word_kv_sweeps` draws (heads' IOI default draws single-token names the same way).
    Remembered per tokenizer (_memo); a new list each call."""
    return list(_memo(tokenizer, ("vocab_words", d_vocab, limit), lambda: _vocab_words(tokenizer, d_vocab, limit)))


def _vocab_words(tokenizer: Any, d_vocab: int | None, limit: int) -> list[tuple[str, int]]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    found: list[tuple[str, int]] = []
    seen: set[str] = set()
    for i in sorted(tokenizer.get_vocab().values()):
        if len(found) >= limit:
            break
        if i in special or (d_vocab is not None and i >= d_vocab):
            continue
        word = tokenizer.decode([i]).strip()
        if len(word) < 2 or not word.isalpha() or word in seen or _one_token(tokenizer, f" {word}", special) != i:
            continue
        seen.add(word)
        found.append((word, i))
    return found


def word_kv_sweeps(
    tokenizer: Any, words: Sequence[tuple[str, int]], *, n_pairs: int = 20, n_examples: int = 16, seed: int = 0,
    positions: Sequence[int] | None = None, query_aware: bool = False, prepend_bos: bool = True,
) -> list[PositionSweep]:
    """Key-value retrieval in the zoo's kv format over the tokenizer's own words (`vocab_words`): `<bos> k v ; k v
    ; ... ; kq` -> vq, keys and values 2 x n_pairs distinct words drawn per example, the pairs separated by the
    first of WORD_SEPARATORS that is one token (else by a word set aside for it). For tokenizers that cannot write
    Liu et al.'s JSON prompt (`json_kv_gap`); query_aware puts kq after <bos> as well."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    sep = next((i for text in WORD_SEPARATORS if (i := _one_token(tokenizer, text, special)) is not None), None)
    pool = [(w, i) for w, i in words if i != sep]
    if sep is None and pool:
        sep, pool = pool[0][1], pool[1:]  # no punctuation piece: a word separates the pairs
    if n_pairs < 2 or 2 * n_pairs > len(pool):
        raise ConfigError(f"key-value retrieval over the tokenizer's words needs 2 x n_pairs distinct one-token words; "
                          f"it has {len(pool)} for n_pairs {n_pairs}.")
    bos = getattr(tokenizer, "bos_token_id", None)
    prefix = [bos] if bos is not None and (prepend_bos or special_affixes(tokenizer)[0][:1] == [bos]) else []
    rng = np.random.default_rng([seed, 76])
    sweeps = []
    for _ in range(n_examples):
        picked = [pool[j] for j in rng.permutation(len(pool))[: 2 * n_pairs]]
        pairs = [(picked[2 * k], picked[2 * k + 1]) for k in range(n_pairs)]  # ((key, id), (value, id))
        g = int(rng.integers(n_pairs))
        (_, key), (value, value_id) = pairs[g]
        chunks = [[k[1], v[1]] for k, v in pairs]
        grid = check_positions(positions, n_pairs)
        sweeps.append(_assemble(grid, [*prefix, *([key, sep] if query_aware else [])], [[]] * n_pairs,
                                [*chunks[:g], *chunks[g + 1:]], chunks[g], [sep], [sep, key], [value_id], (value,),
                                values=tuple(v[0].strip() for _, v in [pairs[g], *pairs[:g], *pairs[g + 1:]])))
    return sweeps


def fit_word_pairs(n_words: int, n_ctx: int, max_pairs: int, extra_new_tokens: int = 8) -> int:
    """The most pairs (up to max_pairs) of `word_kv_sweeps` that its words and the context hold: a prompt of
    n pairs is 3n + 2 tokens with the BOS (query-aware: 2 more), then the answer and greedy decoding's tokens."""
    return max(0, min(max_pairs, (n_words - 1) // 2, (n_ctx - 5 - extra_new_tokens) // 3))
