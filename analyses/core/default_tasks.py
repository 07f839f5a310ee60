"""Default tasks for any model, built from the model's own tokenizer and sized to its context.

The zoo models keep their zoo tasks; every other decoder gets:
- `ioi_task`: an IOI-style template ("When Mary and John went to the store, John gave a drink to"
  -> " Mary") over the common first names that are one token under the tokenizer, with corrupted
  prompts (the other name repeated) and wrong answers, so logit difference and patching work;
- `repeated_tokens_task`: induction on repeated random tokens, the fallback for vocabularies with
  fewer than MIN_NAMES single-token names;
- `sentence_prefix_task`: the shipped sentences cut to one common length (prompt, next token), an
  unpadded task for analyses that read the last position.
`logit_diff_task` picks ioi or induction; `text_task` sentences or, for a vocabulary that does not
write English (mostly unknown tokens), induction; `zoo_or` tries a zoo task first. `shipped_fit`:
how a tokenizer writes the shipped sentences an encoder analysis ran on (tokens a word, unknown
words), so a run on text the model never saw says so (review 7b A5).
"""
from __future__ import annotations

import string
from collections.abc import Callable

import torch

from headscope.analyses.core.tasks import Task, sentence_task, with_bos, zoo
from headscope.errors import ConfigError, TaskError

NAMES = (
    "Mary", "John", "Tom", "James", "David", "Michael", "Sarah", "Emma", "Anna", "Paul",
    "Mark", "Peter", "Lisa", "Laura", "Kate", "Jack", "Alice", "Robert", "Daniel", "Susan",
    "Linda", "Karen", "Helen", "Chris", "Steve", "George", "Frank", "Henry", "Grace", "Rose",
    "Lucy", "Amy", "Ben", "Sam", "Max", "Dan", "Joe", "Tim", "Bob", "Jane",
)
IOI_TEMPLATE = "When {a} and {b} went to the store, {s} gave a drink to"
MIN_NAMES = 4


def zoo_or(model, zoo_name: str, build: Callable[[], Task], n_examples: int, seed: int) -> Task:
    """The zoo task `zoo_name` when the tokenizer covers the zoo vocabulary, the program's own task
    on a Tracr model (tracr_tasks.tracr_task), else build()."""
    from pathlib import Path

    source = getattr(model, "source", None)
    if isinstance(source, str) and (Path(source) / "tracr.json").is_file():
        from headscope.analyses.core.tracr_tasks import tracr_task

        return tracr_task(model, n_examples, seed)
    try:
        return zoo(model, zoo_name, n_examples=n_examples, seed=seed)
    except TaskError:  # not a zoo vocabulary
        return build()


# ---- induction ------------------------------------------------------------------------------------------
def _token_pool(model) -> torch.Tensor:
    """[n] the non-special token ids of the tokenizer that the model embeds."""
    tok = model.tokenizer
    special = set(getattr(tok, "all_special_ids", []) or [])
    vocab = min(len(tok), model.facts.d_vocab) if tok is not None else model.facts.d_vocab
    return torch.tensor([i for i in range(vocab) if i not in special])


def repeated_random_tokens(model, length: int, n: int, seed: int = 0) -> torch.Tensor:
    """[n, 2 * length (+1 with a BOS/CLS prefix)]: random non-special tokens, repeated once."""
    tok = model.tokenizer
    pool = _token_pool(model)
    if len(pool) < length:
        raise ConfigError(f"The vocabulary has {len(pool)} non-special tokens; induction needs length <= that, got {length}.")
    gen = torch.Generator().manual_seed(seed)
    seq = torch.stack([pool[torch.randperm(len(pool), generator=gen)[:length]] for _ in range(n)])  # [n, length]
    tokens = torch.cat([seq, seq], dim=1)  # [n, 2 * length]
    # decoders: the BOS as to_tokens would put it (model.bos_prefix: none under prepend_bos=False when the
    # tokenizer adds none); encoders: [CLS]
    cls = getattr(tok, "cls_token_id", None)
    prefix = model.bos_prefix() if not model.facts.is_encoder else ([cls] if cls is not None else [])
    if prefix:
        tokens = torch.cat([torch.full((n, 1), prefix[0]), tokens], dim=1)
    return tokens


def repeated_tokens_task(model, n_examples: int = 64, seed: int = 0, length: int = 12, *, corrupt: bool = False) -> Task:
    """A decoder Task for any tokenizer (induction): prompts [bos] x x[:k] of random tokens x,
    k = length // 2 for every prompt; answer x[k]; wrong answer x[k + 1], another token of the
    context. Metric: logit difference. length shrinks to fit the context window. corrupt: add
    corrupted prompts [bos] y x[:k] whose first copy y holds other random tokens (nothing to copy)."""
    length = max(2, min(length, (model.facts.n_ctx - 1) // 2))
    full = repeated_random_tokens(model, length, n_examples, seed)  # [n, (1 +) 2 * length]
    start = full.shape[1] - 2 * length
    k = length // 2
    cut = start + length + k  # prompt ends just before the second copy's token k
    tokens = full[:, :cut]  # [n, cut]
    corrupted = None
    if corrupt:
        pool = _token_pool(model)
        gen = torch.Generator().manual_seed(seed + 1)
        corrupted = tokens.clone()
        for row in range(n_examples):
            others = pool[~torch.isin(pool, full[row, start:start + length])]
            others = others if len(others) else pool
            corrupted[row, start:start + length] = others[torch.randint(len(others), (length,), generator=gen)]
    return Task(name="repeat", tokens=tokens, answers=full[:, cut], wrong_answers=full[:, cut + 1],
                corrupted_tokens=corrupted, metric="logit_diff")


# ---- IOI over single-token names ------------------------------------------------------------------------
def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def single_token_names(model) -> dict[str, int]:
    """Name -> token id for the NAMES that are one token after a word under the model's tokenizer
    (" Mary" for byte-level BPE, "▁Mary" for SentencePiece-style BPE, "mary" for WordPiece)."""
    tok = model.tokenizer
    special = set(getattr(tok, "all_special_ids", []) or [])
    lead = _encode(tok, "When")
    found: dict[str, int] = {}
    for name in NAMES:
        ids = _encode(tok, f"When {name}")
        if len(ids) == len(lead) + 1 and ids[:len(lead)] == lead:
            i = ids[-1]
            if i not in special and i < model.facts.d_vocab and i not in found.values():
                found[name] = i
    return found


def ioi_task(model, n_examples: int = 64, seed: int = 0) -> Task:
    """IOI prompts IOI_TEMPLATE over single-token names, both orders of first mention. Answer: the
    indirect object (IO); corrupted prompt: IO repeated instead of the subject S (same length), its
    answer S is the wrong answer. Spans "names", "io", "s1", "s2" as in the zoo task. Raises
    TaskError with fewer than MIN_NAMES names or when the prompts do not fit the context."""
    names = single_token_names(model)
    if len(names) < MIN_NAMES:
        raise TaskError(f"only {len(names)} of {len(NAMES)} common first names are single tokens; the IOI task needs "
                        f"{MIN_NAMES}.")
    if n_examples < 1:
        raise TaskError(f"n_examples must be >= 1, got {n_examples}")
    pool = list(names)
    gen = torch.Generator().manual_seed(seed)
    clean, corrupted, answers, wrong, spans = [], [], [], [], {k: [] for k in ("names", "io", "s1", "s2")}
    for _ in range(20 * n_examples):  # pairs whose template tokenizes differently are dropped
        if len(clean) == n_examples:
            break
        i, j = torch.randperm(len(pool), generator=gen)[:2].tolist()
        io, s = pool[i], pool[j]
        a, b = (io, s) if torch.rand(1, generator=gen).item() < 0.5 else (s, io)
        row = with_bos(model, _encode(model.tokenizer, IOI_TEMPLATE.format(a=a, b=b, s=s)))
        bad = with_bos(model, _encode(model.tokenizer, IOI_TEMPLATE.format(a=a, b=b, s=io)))
        at_s = [p for p, t in enumerate(row) if t == names[s]]
        at_io = [p for p, t in enumerate(row) if t == names[io]]
        if len(row) != len(bad) or len(at_s) != 2 or len(at_io) != 1 or (clean and len(row) != len(clean[0])):
            continue
        first = min(at_s[0], at_io[0])
        clean.append(row)
        corrupted.append(bad)
        answers.append(names[io])
        wrong.append(names[s])
        for key, span in (("names", (first, max(at_s[0], at_io[0]) + 1)), ("io", (at_io[0], at_io[0] + 1)),
                          ("s1", (at_s[0], at_s[0] + 1)), ("s2", (at_s[1], at_s[1] + 1))):
            spans[key].append(span)
    if not clean:
        raise TaskError("the IOI template does not tokenize consistently under this tokenizer.")
    if len(clean[0]) > model.facts.n_ctx:
        raise TaskError(f"the IOI prompts ({len(clean[0])} tokens) do not fit the context of {model.facts.n_ctx}.")
    return Task(
        name="ioi_names", tokens=torch.tensor(clean), corrupted_tokens=torch.tensor(corrupted),  # [batch, pos]
        answers=torch.tensor(answers), wrong_answers=torch.tensor(wrong),  # [batch]
        spans={k: torch.tensor(v, dtype=torch.int64) for k, v in spans.items()},  # [batch, 2]
        metric="logit_diff",
    )


def logit_diff_task(model, n_examples: int = 64, seed: int = 0, repeat_length: int = 12, *, corrupt: bool = False) -> Task:
    """The default logit-difference task of a non-zoo decoder: ioi_task, or induction on repeated
    random tokens where the vocabulary has too few single-token names (corrupt: with corrupted
    prompts, for patching)."""
    try:
        return ioi_task(model, n_examples, seed)
    except TaskError:
        return repeated_tokens_task(model, n_examples, seed, length=repeat_length, corrupt=corrupt)


# ---- sentences ------------------------------------------------------------------------------------------
def sentence_prefix_task(model, n_examples: int | None = None, seed: int | None = None) -> Task:
    """The shipped sentences (sentence_task's tokens, BOS first) cut to the shortest one's length:
    each prompt is a sentence's first tokens and the answer the next one (log-probability), with no
    padding, so analyses that read the last position see a real token in every row. Decoders only."""
    if model.facts.is_encoder:
        raise TaskError("sentence_prefix_task scores next tokens; use sentence_task for encoders.")
    padded = sentence_task(model, n_examples=n_examples, seed=seed)
    real = padded.attention_mask.bool()  # [batch, pos]
    rows = [padded.tokens[i][real[i]].tolist() + [int(padded.answers[i])] for i in range(len(padded))]
    cut = min(min(len(r) for r in rows) - 1, model.facts.n_ctx)
    tokens = torch.tensor([r[:cut] for r in rows])  # [batch, cut]
    answers = torch.tensor([r[cut] for r in rows])  # [batch]
    return Task(name="sentences", tokens=tokens, answers=answers, metric="logprob")


def unknown_share(model, task: Task) -> float:
    """The share of a Task's real tokens that are the tokenizer's unknown token (0 without one)."""
    unk = getattr(model.tokenizer, "unk_token_id", None)
    if unk is None:
        return 0.0
    real = torch.ones_like(task.tokens, dtype=torch.bool) if task.attention_mask is None else task.attention_mask.bool()
    return float((task.tokens[real] == unk).float().mean())


def text_task(model, n_examples: int | None = None, seed: int = 0, *, padded: bool = False) -> Task:
    """The shipped sentences (padded: sentence_task, whole sentences left-padded; else
    sentence_prefix_task), or repeated random tokens where more than half the sentences' tokens are
    unknown to the tokenizer (a vocabulary that does not write English)."""
    task = sentence_task(model, n_examples=n_examples, seed=seed) if padded else sentence_prefix_task(model, n_examples, seed)
    if unknown_share(model, task) > 0.5:
        return repeated_tokens_task(model, n_examples or 64, seed)
    return task


# ---- how a tokenizer writes the shipped sentences -------------------------------------------------------
MAX_TOKENS_PER_WORD = 3.0  # more pieces a word than this: the tokenizer spells the text nearly letter by letter


def _shipped_rows(model, task: Task) -> list[str] | None:
    """The shipped sentences a Task of them holds, row by row; None for any other Task. An encoder's row is
    a whole sentence tokenized with its special tokens (sentence_task); a decoder's is the start of one, BOS
    first (sentence_task, sentence_prefix_task: the sentence less its last tokens), matched to the first
    sentence whose tokens begin with it."""
    from headscope.analyses.core.tasks import shipped_sentences

    if getattr(task, "name", None) != "sentences":
        return None
    tok = model.tokenizer
    real = torch.ones_like(task.tokens, dtype=torch.bool) if task.attention_mask is None else task.attention_mask.bool()
    rows = [tuple(task.tokens[i][real[i]].tolist()) for i in range(len(task))]
    if model.facts.is_encoder:
        known = {tuple(tok(text, add_special_tokens=True)["input_ids"]): text for text in shipped_sentences()}
        texts = [known.get(row) for row in rows]
    else:
        full = [(tuple(with_bos(model, list(tok(text, add_special_tokens=True)["input_ids"]))), text)
                for text in shipped_sentences()]
        texts = [next((text for ids, text in full if ids[:len(row)] == row), None) for row in rows]
    return None if any(t is None for t in texts) else texts


def shipped_fit(model, task: Task) -> dict | None:
    """How the model's tokenizer writes the shipped sentences `task` holds (None for any other Task):
    n_sentences, n_words (whitespace-delimited), n_tokens (no special tokens), tokens_per_word,
    unknown_words (the words, counted once a sentence, that contain the unknown token; models.token_text
    .unknown_words), unknown_examples (the first few), off_distribution (unknown words, or more than
    MAX_TOKENS_PER_WORD tokens a word: text the model was not trained on) and, when off, `note`, the
    sentence the log, the section's provenance and its finding say."""
    from headscope.models.token_text import unknown_words, visible_word

    texts = _shipped_rows(model, task)
    if not texts:
        return None
    tok = model.tokenizer
    n_words = sum(len(t.split()) for t in texts)
    n_tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    unknown = [w for t in texts for w in unknown_words(tok, t)]
    per_word = n_tokens / max(n_words, 1)
    off = bool(unknown) or per_word > MAX_TOKENS_PER_WORD
    examples = list(dict.fromkeys(visible_word(w.strip(string.punctuation) or w) for w in unknown))[:5]
    fit = {"n_sentences": len(texts), "n_words": n_words, "n_tokens": n_tokens, "tokens_per_word": round(per_word, 4),
           "unknown_words": len(unknown), "unknown_examples": examples, "off_distribution": off}
    if off:
        lost = (f" with {len(unknown)} unknown word{'' if len(unknown) == 1 else 's'} ({', '.join(examples[:3])})"
                if unknown else "")
        fit["note"] = (f"the shipped sentences are split into {per_word:.1f} tokens a word{lost} by this tokenizer: the "
                       f"findings describe the model off its training distribution (give it a task of your own: --task)")
    return fit
