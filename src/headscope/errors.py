"""Error types shared by every headscope package.

Each error names what is wrong and how to fix it; each also subclasses the builtin a caller
would naturally catch (ValueError, KeyError, ImportError, ...).
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """The closest candidates to a mistyped name, for "Did you mean ...?" in one-line errors:
    "'a' or 'b'", or a pointer to the table when none is close (hook names, site kinds, keys)."""
    close = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.5)
    return " or ".join(repr(c) for c in close) if close else "one of the names in the site table"


class HeadscopeError(Exception):
    """Base class of every error headscope raises on purpose."""


class ModelNotFoundError(HeadscopeError, ValueError):
    """The model spec names no zoo model, local directory, packaged model or hub repository."""


class OfflineModelError(HeadscopeError, OSError):
    """A hub model was asked for, it is not in the local cache, and the hub cannot be reached."""


class MissingExtraError(HeadscopeError, ImportError):
    """An optional dependency is needed; the message names the pip extra that provides it."""


class SiteError(HeadscopeError, KeyError):
    """An unknown hook site name or kind."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class IndexOutOfRangeError(HeadscopeError, IndexError):
    """A layer, head, neuron or position index outside the model's range."""


class ShapeMismatchError(HeadscopeError, ValueError):
    """Two tensors that must agree in shape (clean vs source, clean vs corrupted) do not."""


class ContextLengthError(HeadscopeError, ValueError):
    """A prompt is longer than the model's context window."""


class ConfigError(HeadscopeError, ValueError):
    """A setting or argument out of its allowed values (a method name, a count, a fraction...)."""


class TaskError(HeadscopeError, ValueError):
    """A task's data cannot serve the analysis: missing answers, mismatched shapes, unknown names."""


class PaddingError(TaskError, ConfigError):
    """A padded batch a pass cannot read: decoders' rows must be left-padded (a run of padding, then the
    prompt, ending at the last position, where the answer is read)."""


class TaskFileError(TaskError):
    """A user task file (JSONL/CSV/Parquet) cannot be read or lacks required fields."""


class TokenizationError(TaskError):
    """Strict mode (`--strict`, `strict=True`): words of the user's text that the tokenizer maps to its
    unknown token, refused instead of the TokenizationWarning; the message names the words and rows."""


class InputTypeError(HeadscopeError, TypeError):
    """An argument of the wrong type (e.g. text where a token tensor is expected)."""


class VocabularyError(HeadscopeError, KeyError):
    """A word or token outside a tokenizer's vocabulary."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnsupportedModelError(HeadscopeError, RuntimeError):
    """The model's architecture cannot run this operation (e.g. cached decoding on an encoder)."""


class UnsupportedAttributeError(UnsupportedModelError, AttributeError):
    """A TransformerLens attribute this model does not have (W_pos on a rotary model): `hasattr`
    is False, and the message says why."""


class MemoryBudgetError(HeadscopeError, ValueError):
    """The memory budget cannot hold even one row of a batched pass."""


class OutputExistsError(HeadscopeError, FileExistsError):
    """The output folder exists and neither --force nor --resume was given."""


class UnknownZooModelError(ModelNotFoundError):
    """A zoo name that is not shipped; the message lists the names that are."""


class HeadscopeWarning(UserWarning):
    """Something headscope falls back from, with the result unchanged but slower (e.g. a resumed
    pass that does not reproduce a full one on this model, so full passes run instead)."""


class TokenizationWarning(HeadscopeWarning):
    """Text the tokenizer handles badly: words that become the unknown token, or a tokenizer class
    that does not reproduce its own vocabulary (decode(encode(text)) != text)."""


class OutputError(HeadscopeError, OSError):
    """The output folder cannot be used as asked: not writable, a symbolic link with --force, a
    full disk; nothing of the user's was deleted."""


class OutputLockedError(OutputError):
    """Another headscope run holds the output folder's lock."""


class RunFailedError(HeadscopeError, RuntimeError):
    """A --force run in which an analysis failed: its results were discarded and the previous
    output is unchanged. `user_mistake` is True when every failure was a HeadscopeError."""

    def __init__(self, message: str, *, user_mistake: bool = False):
        super().__init__(message)
        self.user_mistake = user_mistake


class ModelFileError(HeadscopeError, OSError):
    """A model's files cannot be used: a truncated or corrupt safetensors file, pickle-only weights
    (never unpickled), no tokenizer; the message names the file and what to do."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during a run; the message says what the output folder holds now and how to
    finish the run (`--resume`). A KeyboardInterrupt, so code that catches that still does."""


class ResultFileError(HeadscopeError, OSError):
    """A folder `Result.load` cannot read as a saved Result (missing or damaged result.json or tables)."""
