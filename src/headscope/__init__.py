"""headscope: attention analysis and mechanistic interpretability on TransformerLens's TransformerBridge.

    import headscope as hs
    model = hs.load_model()                      # the embedded zoo model; or "minilm", a dir, a hub name
    acts = hs.capture(model, tokens, [hs.site("pattern", 0)])
"""
from headscope import analyses, hooks, models
from headscope.analyses import tasks
from headscope.analyses.tasks import Task
from headscope.hooks import (
    SITES,
    Activations,
    ablate,
    available_sites,
    capture,
    generate_with_kv,
    head_gates,
    kv_states,
    mlp_memories,
    patch,
    site,
)
from headscope.models import DEFAULT_MODEL, HookedModel, ModelFacts, load_model
from headscope.models.errors import (
    ContextLengthError,
    HeadscopeError,
    IndexOutOfRangeError,
    MissingExtraError,
    ModelNotFoundError,
    OfflineModelError,
    ShapeMismatchError,
    SiteError,
)
from headscope.version import __version__

__all__ = [
    "DEFAULT_MODEL",
    "SITES",
    "Activations",
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
    "Task",
    "__version__",
    "ablate",
    "analyses",
    "available_sites",
    "capture",
    "generate_with_kv",
    "head_gates",
    "hooks",
    "kv_states",
    "load_model",
    "mlp_memories",
    "models",
    "patch",
    "site",
    "tasks",
]
