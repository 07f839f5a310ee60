"""Which Hugging Face architectures TransformerLens's bridge loads, asked of TransformerLens itself before anything loads.

TransformerLens 4.x's TransformerBridge picks an adapter from the config (`determine_architecture_from_hf_config`:
`architectures`, then a `model_type` mapping) and raises a ValueError listing its ~160 adapters where none fits
(review 19d A1: ELECTRA, DistilBERT, ModernBERT, DeBERTa-v2 ended in that 4,140-character error after the weights
loaded). `bridge_boot_kwargs` asks the same function first, from the config alone, and refuses in one line
(UnsupportedModelError) naming the architecture and the nearest ones it loads. One alias: XLMRobertaForMaskedLM,
whose modules and weights are RoBERTa's, boots through the RoBERTa adapter with transformers' own XLM-R class
(equal to Hugging Face's logits and patterns, tests/models/test_bridge_support.py).
"""
from __future__ import annotations

import difflib
from types import SimpleNamespace
from typing import Any

from headscope.errors import UnsupportedModelError

# HF architecture -> the TransformerLens adapter that computes it exactly (checked against HF in the tests)
ALIASES = {"XLMRobertaForMaskedLM": "RobertaForMaskedLM"}
_ENCODER_WORDS = ("MaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                  "ForPreTraining", "ForMultipleChoice")
_DECODER_WORDS = ("CausalLM", "LMHeadModel")


def supported_architectures() -> list[str]:
    """The architecture names TransformerLens's bridge has an adapter for (its own table, not a copy)."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    return list(SUPPORTED_ARCHITECTURES)


def _tl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return ".".join(version("transformer-lens").split(".")[:2])
    except PackageNotFoundError:
        return "4.x"


def _view(config: Any) -> Any:
    """A config object with attributes (a config.json dict, when AutoConfig could not read it, as one)."""
    return SimpleNamespace(**config) if isinstance(config, dict) else config


def tl_architecture(config: Any) -> str | None:
    """The adapter TransformerLens would choose for this HF config, None where it has none."""
    from transformer_lens.model_bridge.sources.transformers import determine_architecture_from_hf_config

    try:
        return determine_architecture_from_hf_config(_view(config))
    except ValueError:
        return None


def _kind(arch: str) -> str:
    if any(w in arch for w in _DECODER_WORDS):
        return "decoder"
    if any(w in arch for w in _ENCODER_WORDS) or arch.endswith("Model"):
        return "encoder"
    return "other"


def nearest_words(arch: str) -> str:
    """The supported architectures nearest to `arch`, in words: for an encoder every masked LM it loads (BERT,
    RoBERTa, and the aliases), else the three closest names of the same kind."""
    supported = supported_architectures()
    kind = _kind(arch)
    if kind == "encoder":
        encoders = [a for a in supported if "MaskedLM" in a]
        aliases = [f"{a} (through {b}'s adapter)" for a, b in ALIASES.items() if "MaskedLM" in a]
        return f"the encoders it loads are {', '.join(encoders + aliases)}"
    pool = [a for a in supported if _kind(a) == kind] if kind == "decoder" else supported
    close = difflib.get_close_matches(arch, pool, n=3, cutoff=0.0)
    what = "decoders" if kind == "decoder" else "architectures"
    return f"the nearest {what} it loads by name are {', '.join(close)} ({len(supported)} architectures in all)"


def bridge_boot_kwargs(config: Any, name: str) -> dict[str, Any]:
    """Extra TransformerBridge.boot_transformers arguments for this config ({} for most; an alias's adapter and model
    class), or UnsupportedModelError in one line where TransformerLens's bridge has no adapter for it. A missing
    config (a hub model not cached) passes: the bridge then reads it itself."""
    if config is None:
        return {}
    view = _view(config)
    archs = [str(a) for a in (getattr(view, "architectures", None) or [])]
    if tl_architecture(config) is not None:
        return {}
    alias = next((a for a in archs if a in ALIASES), None)
    if alias is not None:
        import transformers

        return {"hf_config_overrides": {"original_architecture": ALIASES[alias]},
                "model_class": getattr(transformers, alias)}
    arch = archs[0] if archs else "no architectures entry"
    model_type = getattr(view, "model_type", None)
    raise UnsupportedModelError(
        f"{name} ({arch}{f', model_type {model_type}' if model_type else ''}) cannot load: TransformerLens "
        f"{_tl_version()}'s bridge, through which headscope loads every model, has no adapter for it; "
        f"{nearest_words(arch)}. Nothing was loaded or written.")
