"""Parameters Hugging Face keeps in float32 under a half-precision load, kept there.

`from_pretrained(dtype=torch.bfloat16)` loads a model's `_keep_in_fp32_modules_strict` (and, in float16, its
`_keep_in_fp32_modules`) in float32: DeepSeek-V3's, Glm4-MoE's and Ernie 4.5-MoE's router weights, for example, whose
routers then score in float32. TransformerLens's boot loads the same way, then casts every floating parameter to the
requested dtype (`maybe_cast_floating_params`), which rounds those weights to bfloat16: router logits then differ from
Hugging Face's own bfloat16 model by about 0.1 and the experts chosen can change (review 20e A2). While
`hf_float32_kept` is open, that cast leaves alone every parameter the load left in float32 (exactly Hugging Face's
plan, with no pattern of ours), so the bridge holds the model Hugging Face's half-precision load holds.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_HALF = (torch.bfloat16, torch.float16)


@contextmanager
def hf_float32_kept() -> Iterator[None]:
    """While open, TransformerLens's cast of a freshly loaded Hugging Face model to a half-precision dtype keeps the
    parameters the load left in float32; restored on exit (a TransformerLens without that step: nothing changes)."""
    try:  # the boot imports it from here at each call (model_bridge/sources/transformers/source.py)
        from transformer_lens.utilities import multi_gpu as source
    except ImportError:  # another layout of TransformerLens: nothing to wrap
        yield
        return
    cast = getattr(source, "maybe_cast_floating_params", None)
    if cast is None:
        yield
        return

    def keeping(model: Any, dtype: torch.dtype) -> None:
        kept = {} if dtype not in _HALF or _quantized(model) else {  # a quantized model: TransformerLens casts nothing
            name: p.detach().clone() for name, p in model.named_parameters()
            if p.dtype == torch.float32 and p.device.type != "meta"}  # offloaded (meta) weights: Accelerate's to keep
        cast(model, dtype)
        if kept:
            own = dict(model.named_parameters())
            for name, value in kept.items():
                own[name].data = value  # the float32 values the load gave, not their half-precision rounding

    source.maybe_cast_floating_params = keeping
    try:
        yield
    finally:
        source.maybe_cast_floating_params = cast


def _quantized(model: Any) -> bool:
    """Whether the model carries an active quantizer (TransformerLens then skips its cast altogether)."""
    try:
        from transformer_lens.utilities.quantization import quantization_method
    except ImportError:
        return getattr(getattr(model, "config", None), "quantization_config", None) is not None
    return quantization_method(getattr(model, "config", None)) is not None
