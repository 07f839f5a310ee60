"""Particulars of a model's attention and MLP read from its Hugging Face modules and config (review 19b, GPT-OSS), for
ModelFacts, print(model) and the report header:

- learned attention sinks: a per-head logit (the attention module's `sinks` parameter) joins each row's softmax
  and is dropped after it, so a row's weights over the keys sum to less than 1 (HF GptOssAttention's eager forward);
- attention biases (config.attention_bias), rope scaling (rope_parameters' rope_type, e.g. YaRN, and its factor);
- the experts' own activation where it is not the config's hidden_act (GPT-OSS's clamped SwiGLU).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

SINK_WORDS = "learned attention sinks: each row's weights over the keys sum to less than 1"


def learned_sinks(bridge: Any) -> bool:
    """Whether any block's Hugging Face attention module has a learned sink logit per head (a `sinks` tensor)."""
    from headscope.models.hooked_model import raw_module  # it imports this module

    return any(isinstance(getattr(raw_module(b.attn), "sinks", None), torch.Tensor)
               for b in getattr(bridge, "blocks", None) or [] if getattr(b, "attn", None) is not None)


def rope_scaling(config: Any) -> str | None:
    """'YaRN rope scaling (factor 32)' where the config's rope parameters name a scaling other than the default
    (a per-layer-type mapping, Gemma 3's, is read by rope_bases and left out here), else None."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        return None
    kind = params.get("rope_type", params.get("type"))
    if not isinstance(kind, str) or kind == "default":
        return None
    factor = params.get("factor")
    name = {"yarn": "YaRN", "longrope": "LongRoPE", "llama3": "Llama 3", "dynamic": "dynamic NTK"}.get(kind, kind)
    return f"{name} rope scaling" + (f" (factor {factor:g})" if isinstance(factor, (int, float)) else "")


def expert_act(bridge: Any) -> str | None:
    """The experts' own activation where they ignore hidden_act (models.moe_layout.expert_activation), else None."""
    from headscope.models.moe_layout import expert_activation, moe_parts

    for block in getattr(bridge, "blocks", None) or []:
        parts = moe_parts(getattr(block, "mlp", None))
        if parts is not None and (words := expert_activation(parts[1])):
            return words
    return None


_PROJECTIONS = (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj"))


def biased_projections(bridge: Any) -> tuple[str, ...]:
    """Which of the first block's attention projections carry a bias, read off its Hugging Face modules ("q", "k",
    "v", "output"): config.attention_bias does not say (Glm4's is True with o_proj unbiased, review 20d A1); () where
    the attention has no separate q/k/v/o projections (a fused qkv: the bias words then follow the config)."""
    from headscope.models.hooked_model import raw_module

    blocks = list(getattr(bridge, "blocks", None) or [])
    attn = raw_module(blocks[0].attn) if blocks and getattr(blocks[0], "attn", None) is not None else None
    mods = [(name, getattr(attn, attr, None)) for name, attr in _PROJECTIONS]
    if attn is None or not all(isinstance(m, torch.nn.Module) for _, m in mods):
        return ()
    return tuple(name for name, m in mods if isinstance(getattr(m, "bias", None), torch.Tensor))


def facts(bridge: Any, config: Any) -> dict[str, Any]:
    """ModelFacts' learned_sinks, attention_bias (and which projections: attention_bias_on), rope_scaling and
    expert_act."""
    bias = getattr(config, "attention_bias", None)
    on = biased_projections(bridge)  # read off the modules: Qwen2's q/k/v and Starcoder2's biases have no such flag
    return {"learned_sinks": learned_sinks(bridge), "attention_bias": bias is True or bool(on), "attention_bias_on": on,
            "rope_scaling": rope_scaling(config), "expert_act": expert_act(bridge)}


def bias_words(on: Any) -> str:
    """'attention biases on q, k and v (none on the output)', 'attention biases on q, k, v and the output' (also where
    the projections were not read: an older manifest, a fused qkv)."""
    on = [str(x) for x in on or () if str(x) in ("q", "k", "v", "output")]
    if not on or on == ["q", "k", "v", "output"]:
        return "attention biases on q, k, v and the output"
    names = [("the output" if x == "output" else x) for x in on]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"attention biases on {listed}" + ("" if "output" in on else " (none on the output)")


def header_words(model: Mapping[str, Any]) -> list[str]:
    """The header's phrases for these facts (a manifest's "model"): the learned sinks (with their mean share of a row
    on this data where the kv or position analysis measured it: `learned_sink_share`), attention biases, rope scaling,
    the experts' own activation."""
    words = []
    if model.get("learned_sinks"):
        share = model.get("learned_sink_share")
        words.append(SINK_WORDS + (f" (mean {share:.3f} of a row on this data)" if isinstance(share, float) else ""))
    if model.get("attention_bias"):
        words.append(bias_words(model.get("attention_bias_on")))
    if isinstance(model.get("rope_scaling"), str):
        words.append(model["rope_scaling"])
    if isinstance(model.get("expert_act"), str):  # review 19b A3: not the config's hidden_act
        words.append(f"experts' activation {model['expert_act']}")
    return words


def repr_words(facts: Any) -> str:
    """print(model)'s fields for these facts, each with ', ' after."""
    out = ""
    if getattr(facts, "learned_sinks", False):
        out += "learned_sinks=True (each row's weights over the keys sum to less than 1), "
    if getattr(facts, "attention_bias", False):
        on = getattr(facts, "attention_bias_on", ())
        out += "attention_bias=True" + (f" ({bias_words(on).removeprefix('attention biases ')})" if on else "") + ", "
    if getattr(facts, "rope_scaling", None):
        out += f"rope_scaling={facts.rope_scaling}, "
    return out
