"""Model loading: zoo models, the packaged MiniLM, local directories and hub names."""
from headscope.errors import (
    ContextLengthError,
    HeadscopeError,
    IndexOutOfRangeError,
    MissingExtraError,
    ModelNotFoundError,
    OfflineModelError,
    ShapeMismatchError,
    SiteError,
)
from headscope.models.hooked_model import HookedModel, ModelFacts
from headscope.models.loading import DEFAULT_MODEL, load_model, resolve_spec

__all__ = [
    "DEFAULT_MODEL",
    "ContextLengthError",
    "HeadscopeError",
    "HookedModel",
    "IndexOutOfRangeError",
    "MissingExtraError",
    "ModelFacts",
    "ModelNotFoundError",
    "OfflineModelError",
    "ShapeMismatchError",
    "SiteError",
    "load_model",
    "resolve_spec",
]
