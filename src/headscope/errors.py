"""Error types shared by every headscope package.

Each error names what is wrong and how to fix it; each also subclasses the builtin a caller
would naturally catch (ValueError, KeyError, ImportError, ...).
"""
from __future__ import annotations


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
