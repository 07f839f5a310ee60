"""Token text: how a tokenizer's ids read, and whether its words survive it.

- `token_strings` / `readable_text` / `prompt_label`: ids decoded alone or as one text, with a token that is part of a
  character's UTF-8 bytes written `<0xE2>` (byte-level BPE's pieces mapped back to their bytes), never U+FFFD.
- `unknown_words` / `round_trip_problem`: the words a tokenizer turns into its unknown token, and whether
  decode(encode(text)) gives back text built from its own vocabulary (`probe_words`).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any


def unknown_words(tokenizer: Any, text: str) -> list[str]:
    """The whitespace-delimited words of `text` that contain the tokenizer's unknown token, in
    order, each once (empty when the tokenizer has no unknown token); whitespace that becomes the unknown token
    itself (a newline under a Metaspace tokenizer) comes back as that whitespace: show it through visible_word."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not text:
        return []
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = [tuple(span) for i, span in zip(enc["input_ids"], enc["offset_mapping"]) if i == unk]
    except (NotImplementedError, ValueError, TypeError, KeyError):  # slow tokenizers have no offsets
        spans = [(a, b) for a, b in words if unk in tokenizer(text[a:b], add_special_tokens=False)["input_ids"]]
    found = []
    for start, end in spans:
        hit = [text[a:b] for a, b in words if a < max(end, start + 1) and b > start]
        found.extend(hit or [text[start:end]])
    return list(dict.fromkeys(w for w in found if w))


def visible_word(word: str) -> str:
    """A word as a reason or a note shows it: unchanged, except whitespace and control characters written as
    escapes (a newline that became the unknown token reads \\n, a space \\x20), never a blank (review 19d C1)."""
    if word.isprintable() and word.strip():
        return word
    return "".join("\\x20" if c == " " else c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in word)


def probe_words(tokenizer: Any, n: int = 6, scan: int = 400) -> list[str]:
    """Up to n words from the tokenizer's own vocabulary (ASCII letters and digits, at least two
    characters, as the tokenizer decodes the single token), spread over the vocabulary."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError):
        return []
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = sorted(i for i in set(vocab.values()) if i not in special)
    if not ids:
        return []
    step = max(1, len(ids) // scan)
    words: list[str] = []
    for i in ids[::step]:  # about `scan` ids spread evenly over the vocabulary
        try:
            word = tokenizer.decode([i]).strip()
        except Exception:  # noqa: BLE001 - a broken id must not stop loading
            continue
        if len(word) >= 2 and word.isascii() and word.isalnum() and word not in words:
            words.append(word)
    if len(words) <= n:
        return words
    return [words[round(k * (len(words) - 1) / (n - 1))] for k in range(n)]


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each id's text as the tokenizer decodes it alone (no clean-up of spaces, special tokens kept):
    " Mary" for byte-level BPE's "ĠMary", the token itself for word-level and WordPiece vocabularies.
    SentencePiece's word-start "▁" reads as a space too ("▁Mary" -> " Mary"): its decoder strips
    the space from a text's first token, so decoding the token alone would drop it. Ids the
    tokenizer does not know read "<id N>"."""
    ids = [int(i) for i in ids]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    known = [i for i, piece in zip(ids, pieces) if piece is not None]
    texts = iter(tokenizer.batch_decode([[i] for i in known], clean_up_tokenization_spaces=False) if known else [])
    out = []
    for i, piece in zip(ids, pieces):
        if piece is None:
            out.append(f"<id {i}>")
            continue
        text = next(texts)
        if "\ufffd" in text and "\ufffd" not in piece:  # part of a character's UTF-8 bytes (review 12c C5)
            raw = piece_bytes(piece)
            text = escape_bytes(raw) if raw is not None else piece  # a byte fallback's piece is "<0xE2>" already
        out.append(" " + text if piece.startswith("\u2581") and not text.startswith(" ") else text)
    return out


@functools.cache
def _byte_of() -> dict[str, int]:
    """Byte-level BPE's table from its printable stand-ins back to bytes (GPT-2's scheme, which the `tokenizers`
    ByteLevel pre-tokenizer shares): the printable Latin-1 bytes stand for themselves, the other 68 for the
    characters from U+0100 up, in byte order."""
    own = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in own}
    others = [b for b in range(256) if b not in table.values()]
    table.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return table


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a byte-level BPE piece ("\u0120Mary", "\u00e2\u0080") stands for; None for a piece outside that
    alphabet (a SentencePiece or WordPiece token, a special token's name that is not byte-level)."""
    table = _byte_of()
    return bytes(table[c] for c in piece) if piece and all(c in table for c in piece) else None


def escape_bytes(raw: bytes) -> str:
    """`raw` as UTF-8 text, each byte that is no part of a whole character written <0xE2>: random tokens split
    characters, which a decoder would show as U+FFFD (review 12a, 12c C5)."""
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c
                   for c in raw.decode("utf-8", "surrogateescape"))


def readable_text(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
    """The ids decoded as one text, as tokenizer.decode gives it, except that bytes which form no character
    (random byte-level tokens: the "repeat" task) read <0xE2> rather than U+FFFD: a byte-level vocabulary's
    bytes are joined and decoded once (a character split over two tokens reads whole), others fall back to
    token_strings (which escapes each token alone)."""
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    if "\ufffd" not in text:
        return text
    special = set(getattr(tokenizer, "all_special_ids", None) or ()) if skip_special_tokens else set()
    kept = [i for i in ids if i not in special]
    raws = [piece_bytes(p) if p is not None else None for p in tokenizer.convert_ids_to_tokens(kept)]
    if kept and all(r is not None for r in raws):
        return escape_bytes(b"".join(raws))
    return "".join(token_strings(tokenizer, kept)).lstrip(" " if not text.startswith(" ") else "")


FRAME_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id")


def prompt_label(tokenizer: Any, ids: Sequence[int]) -> str:
    """The ids as the explorer's prompt list labels them: `readable_text` with every token kept but the ones that
    frame a prompt (BOS, EOS, PAD, CLS, SEP; the token strip shows those), so a word that became <unk> reads <unk>
    (review 13c C4) and byte-fallback pieces a tokenizer registered as special tokens read as their characters
    (review 13b C5), where decode(skip_special_tokens=True) dropped both."""
    frame = {getattr(tokenizer, name, None) for name in FRAME_TOKENS} - {None, getattr(tokenizer, "unk_token_id", None)}
    return readable_text(tokenizer, [int(i) for i in ids if int(i) not in frame], skip_special_tokens=False)


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def round_trip_problem(tokenizer: Any) -> str | None:
    """None when decode(encode(text)) reproduces text built from the tokenizer's own vocabulary
    (after stripping, collapsing whitespace and case-folding, so lower-casing WordPiece and
    sentencepiece's leading space pass); else what went wrong, in words."""
    words = probe_words(tokenizer)
    if len(words) < 2:
        return None  # nothing to probe with (e.g. a character-level vocabulary)
    text = " ".join(words)
    try:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        back = tokenizer.decode(ids, skip_special_tokens=True)
    except Exception as err:  # noqa: BLE001 - any failure here is the problem to report
        return f"tokenizing {text!r} failed ({type(err).__name__}: {err})"
    if _normal(back) == _normal(text):
        return None
    return f"{text!r} (words of its own vocabulary) -> {len(ids)} ids -> {back!r}"
