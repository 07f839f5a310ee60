"""The zoo's word-level vocabulary and its Hugging Face tokenizer.

Every zoo task is written in whole words, one token per word, so that token positions are
exact and spans are easy to mark. The vocabulary is a fixed, ordered list (ids never depend on
a seed), grouped by role: key/value tokens for kv, subject syllables, relations and objects for
facts, names and template words for ioi. The tokenizer is a `tokenizers` WordLevel model with a
WhitespaceSplit pre-tokenizer, wrapped in `transformers.PreTrainedTokenizerFast` and saved in
every checkpoint, so that Hugging Face and TransformerLens load it from the directory.
"""
from __future__ import annotations

from collections.abc import Sequence

from headscope.errors import VocabularyError

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<bos>", "<eos>"
SPECIALS: tuple[str, ...] = (UNK, PAD, BOS, EOS)

N_KEYS = 64
N_VALUES = 64
KEYS: tuple[str, ...] = tuple(f"k{i:02d}" for i in range(N_KEYS))
VALUES: tuple[str, ...] = tuple(f"v{i:02d}" for i in range(N_VALUES))
SEP = ";"

# facts: a subject is two syllables ("bal ado"); three relations, ten objects each
SUBJECT_FIRST: tuple[str, ...] = (
    "bal", "cor", "dun", "fen", "gar", "hol", "jas", "kel", "lum", "mor",
    "nev", "pel", "quin", "ros", "sel", "tam", "vor", "wen", "yar", "zel",
)
SUBJECT_SECOND: tuple[str, ...] = (
    "ado", "bek", "cin", "dor", "eli", "fum", "gis", "hap", "iru", "jon",
)
RELATIONS: tuple[str, ...] = ("lives_in", "works_as", "likes")
OBJECTS: dict[str, tuple[str, ...]] = {
    "lives_in": ("paris", "tokyo", "lima", "oslo", "cairo", "delhi", "quito", "rome", "seoul", "kyiv"),
    "works_as": ("baker", "nurse", "pilot", "judge", "farmer", "poet", "chef", "miner", "tailor", "sailor"),
    "likes": ("tea", "rice", "jazz", "chess", "soup", "figs", "golf", "opera", "plums", "kites"),
}

# ioi: names and the words of the templates
NAMES: tuple[str, ...] = (
    "Mary", "John", "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry",
    "Irene", "Jack", "Kate", "Leo", "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam",
    "Tina", "Umar", "Vera", "Will",
)
TEMPLATE_WORDS: tuple[str, ...] = (
    "when", "after", "while", "then", "once", "as", "and", "went", "to", "the", "shop", "park",
    "were", "at", "school", "met", "market", "sat", "in", "garden", "walked", "station",
    "gave", "handed", "sent", "threw", "passed", "a", "book", "ball", "pen", "letter", "map",
    "kite", "later", ",", ".",
)


def _ordered_words() -> tuple[str, ...]:
    """All words, specials first, each once, in a fixed order (ids are positions here)."""
    groups: list[Sequence[str]] = [
        SPECIALS, (SEP,), KEYS, VALUES, SUBJECT_FIRST, SUBJECT_SECOND, RELATIONS,
        *OBJECTS.values(), NAMES, TEMPLATE_WORDS,
    ]
    words: list[str] = []
    for group in groups:
        words.extend(w for w in group if w not in words)
    return tuple(words)


WORDS: tuple[str, ...] = _ordered_words()
WORD_TO_ID: dict[str, int] = {w: i for i, w in enumerate(WORDS)}
VOCAB_SIZE = len(WORDS)

# Tokens drawn for the induction task: every content word (not specials, not punctuation),
# so that the copying circuit is general rather than tied to one task's tokens.
INDUCTION_POOL: tuple[str, ...] = tuple(
    w for w in WORDS if w not in SPECIALS and w not in (SEP, ",", ".")
)


def ids(words: Sequence[str]) -> list[int]:
    """Map words to ids; raises KeyError naming the first unknown word."""
    try:
        return [WORD_TO_ID[w] for w in words]
    except KeyError as err:
        raise VocabularyError(f"{err.args[0]!r} is not in the zoo vocabulary") from None


def build_tokenizer():
    """A PreTrainedTokenizerFast over the zoo vocabulary (WordLevel, whitespace split).

    No post-processor: callers add <bos> themselves, so that prompts are exactly the words given.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(WordLevel(vocab=dict(WORD_TO_ID), unk_token=UNK))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=UNK, pad_token=PAD, bos_token=BOS, eos_token=EOS,
        model_max_length=128, padding_side="right",
    )
