"""headscope: attention analysis and mechanistic interpretability on TransformerLens's TransformerBridge.

    import headscope as hs
    model = hs.load_model()                      # the embedded zoo model; or "minilm", a dir, a hub name
    acts = hs.capture(model, tokens, [hs.site("pattern", 0)])
"""
from headscope import analyses, hooks, models
from headscope.analyses.core import tasks
from headscope.analyses.core.tasks import Task
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
from headscope.version import __version__

# Analyses and reports load lazily (hs.head_importance, hs.build_report, ...): `import headscope`
# stays fast, and the CLI's --help does not import every analysis.
_LAZY = {
    "head_importance": "headscope.analyses.heads.analysis",
    "prune_heads": "headscope.analyses.heads.analysis",
    "activation_patching": "headscope.analyses.patching.analysis",
    "causal_tracing": "headscope.analyses.patching.causal_tracing",
    "attribution_patching": "headscope.analyses.patching.attribution_patching",
    "path_patching": "headscope.analyses.patching.path_patching",
    "attribution": "headscope.analyses.attribution.analysis",
    "position_bias": "headscope.analyses.position.analysis",
    "probe_sweep": "headscope.analyses.probes.analysis",
    "build_report": "headscope.reports.report",
    "Result": "headscope.analyses.core.result",
    "RunConfig": "headscope.analyses.core.registry",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headscope' has no attribute {name!r}")


__all__ = [
    *_LAZY,
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
