"""State-space and other non-attention mixers: found in a model's config and module tree, refused at load.

headscope analyses attention-only transformers: every layer's token mixer is softmax attention, whose heads,
q/k/v sites, patterns and KV cache the analyses read. A hybrid (Jamba: Mamba layers between attention layers;
FalconH1: a Mamba2 branch beside every layer's attention; Zamba2, Bamba, NemotronH, GraniteMoeHybrid, Qwen3-Next's
linear attention, RecurrentGemma's recurrences, LFM2's convolutions) or a pure state-space model (Mamba, Mamba2, RWKV)
has layers or branches that write to the residual stream outside any hook an analysis reads (review 18c A3/A4: six
analyses failed on Jamba with SiteErrors about other layers; FalconH1's Mamba branch became an unnamed "remainder"
of 5.7 of 8.7 logits). `refuse_state_space` says so in one line (UnsupportedModelError) before any analysis runs or
any file is written: from the HF config before the bridge boots (`config_reason`), and from the loaded module tree
(`module_reason`: SSM parameters such as A_log, dt_proj, conv1d) for what a config does not name.
"""
from __future__ import annotations

import re
from typing import Any

from headscope.errors import UnsupportedModelError

# per-layer kind names of non-attention mixers (Jamba "mamba", Jamba/Qwen3-Next/GraniteMoeHybrid "linear_attention",
# FalconH1/Zamba2 "hybrid", RecurrentGemma "recurrent", LFM2 "conv"); "full_attention", "sliding_attention",
# "attention", "chunked_attention" ... are attention
_NOT_ATTENTION = re.compile(r"mamba|ssm|linear|conv|recurren|rwkv|delta|hybrid|retention|hyena|lru", re.IGNORECASE)
_LAYER_LISTS = ("layers_block_type", "layer_types", "block_types")
# config fields that only state-space models have (Mamba, Mamba2, FalconMamba: state_size + conv_kernel)
_SSM_FIELDS = ("mamba_d_state", "ssm_state_size", "mamba_n_heads", "mamba_num_heads", "n_mamba_heads", "mamba_expand")
_SSM_MODEL_TYPES = ("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm")
# parameter/module names of state-space mixers (Mamba's A_log, D, dt_proj, conv1d; Mamba2's dt_bias; RWKV's time_decay)
_SSM_PARAMS = re.compile(r"(^|\.)(A_log|dt_bias|time_decay|time_first)$|(^|\.)(dt_proj|x_proj|conv1d)\.weight$")
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|blocks|h|layer)\.(\d+)\.")


def _ranges(layers: list[int]) -> str:
    """[0, 2, 3, 4] -> '0, 2-4'."""
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _layers_words(layers: list[int], n_layers: int) -> str:
    if n_layers and len(layers) == n_layers:
        return f"all {n_layers} layers" if n_layers > 1 else "its one layer"
    return f"layer{'s' if len(layers) > 1 else ''} {_ranges(layers)} of {n_layers}"


def config_reason(config: Any) -> str | None:
    """Which layers of a HF config are not attention-only, in words with the field that says so; None for an
    attention-only transformer (as far as its config tells)."""
    get = (config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default))
    n_layers = int(get("num_hidden_layers", 0) or get("n_layer", 0) or 0)
    for field in _LAYER_LISTS:
        try:
            kinds = get(field, None)
        except Exception:  # noqa: BLE001 - a config property that cannot compute on this config
            kinds = None
        if isinstance(kinds, (list, tuple)) and kinds and all(isinstance(k, str) for k in kinds):
            bad = {i: k for i, k in enumerate(kinds) if _NOT_ATTENTION.search(k)}
            if bad:
                names = sorted(set(bad.values()))
                mamba = "mamba" in str(get("model_type", "")) or any("mamba" in k.lower() for k in names) or any(
                    str(key).startswith("mamba") for key in (config if isinstance(config, dict) else vars(config)))
                what = "a Mamba (state-space) mixer" if mamba else "a non-attention mixer (state-space, recurrent, " \
                    "linear attention or convolution)"
                return (f"{_layers_words(sorted(bad), n_layers or len(kinds))} run{'' if len(bad) > 1 else 's'} "
                        f"{what}{' beside or in place of attention' if 'hybrid' in names else ''} "
                        f"(config {field}: {', '.join(repr(k) for k in names)})")
    period, offset = get("attn_layer_period", None), get("attn_layer_offset", None)
    if isinstance(period, int) and isinstance(offset, int) and period > 1 and n_layers:
        bad_layers = [i for i in range(n_layers) if i % period != offset]
        if bad_layers:
            return (f"{_layers_words(bad_layers, n_layers)} run{'' if len(bad_layers) > 1 else 's'} a Mamba mixer, "
                    f"not attention (config attn_layer_period {period}, attn_layer_offset {offset})")
    model_type = str(get("model_type", "") or "")
    if model_type in _SSM_MODEL_TYPES:
        return (f"{_layers_words(list(range(n_layers)), n_layers) if n_layers else 'its layers'} run a state-space "
                f"mixer, not attention (config model_type {model_type!r})")
    fields = [f for f in _SSM_FIELDS if get(f, None) is not None]
    if fields:
        return f"its config names a state-space mixer ({', '.join(fields)})"
    return None


def module_reason(model: Any, n_layers: int = 0) -> str | None:
    """Which layers of a loaded model hold state-space parameters (A_log, dt_bias, dt_proj, conv1d, time_decay), in
    words; None where none does."""
    layers: dict[int, str] = {}
    other: list[str] = []
    every = {int(m.group(1)) for m in (_LAYER_INDEX.search(n) for n, _ in model.named_parameters()) if m}
    n_layers = n_layers or (max(every) + 1 if every else 0)
    for name, _ in model.named_parameters():
        if not _SSM_PARAMS.search(name):
            continue
        found = _LAYER_INDEX.search(name)
        if found:
            layers.setdefault(int(found.group(1)), name.rsplit(".", 1)[-1] if not name.endswith(".weight")
                              else name.rsplit(".", 2)[-2])
        else:
            other.append(name)
    if not layers and not other:
        return None
    if not layers:
        return f"it holds state-space parameters ({', '.join(other[:3])})"
    names = sorted(set(layers.values()))
    return (f"{_layers_words(sorted(layers), n_layers)} "
            f"{'hold' if len(layers) > 1 else 'holds'} a state-space mixer (its parameters {', '.join(names)})")


def refuse_state_space(config: Any, name: str, model: Any = None) -> None:
    """UnsupportedModelError in one line where the config (or, given, the loaded HF model's module tree) shows
    layers that are not attention: the architecture, which layers, and that headscope analyses attention-only
    transformers; nothing on an attention-only transformer."""
    reason = config_reason(config) if config is not None else None
    if reason is None and model is not None:
        get = (config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default))
        reason = module_reason(model, int(get("num_hidden_layers", 0) or 0) if config is not None else 0)
    if reason is None:
        return
    get = (config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default))
    archs = get("architectures", None) if config is not None else None
    arch = (archs[0] if isinstance(archs, (list, tuple)) and archs else
            type(model).__name__ if model is not None else str(get("model_type", "this model")))
    raise UnsupportedModelError(
        f"{name} ({arch}) is not an attention-only transformer: {reason}; headscope analyses attention-only "
        f"transformers (heads, q/k/v sites, patterns, KV cache), and these mixers write to the residual stream outside "
        f"every site it reads, so it does not load this model.")
