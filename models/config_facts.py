"""What a model multiplies, caps and rotates by, read from its Hugging Face modules and config (review 18b A3, A4,
C1), for ModelFacts, print(model), the report header and model.cfg's TransformerLens fields:

- the embedding's scale: the embedding module's own (Gemma's x sqrt(d_model), in the weights' dtype) times the
  bridge's after it (Granite's embedding_multiplier);
- the attention scores' scale where it is not 1/sqrt(d_head): each attention module's `scaling` (Gemma 2/3's
  query_pre_attn_scalar^-0.5);
- the soft-caps: final logits cap * tanh(logit / cap), attention scores the same (Gemma 2);
- each layer's rotary base (Gemma 3: 10,000 on sliding layers, 1,000,000 on global ones), and the layers without
  rotary (SmolLM3's and Llama 4's NoPE layers, no_rope_layers; Cohere2's and Exaone4's global layers).

TransformerLens 4.3's bridge leaves several of these at its defaults (attn_scale -1, use_qk_norm False, window_size
None, rotary_base 10000 wherever the HF config has no flat rope_theta); `tl_config_fields` gives the true values,
which loading writes into the bridge's cfg once, at load (README, "TransformerLens habits").
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch


def hf_text_config(bridge: Any) -> Any:
    """The Hugging Face config of the bridge's model (its text config where it has one), or None."""
    config = getattr(getattr(bridge, "original_model", None), "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def embedding_scales(bridge: Any) -> tuple[float, float]:
    """(inside, after): what the input embedding module itself multiplies by, in its weights' dtype as its forward
    does (Gemma's embed_scale, sqrt(d_model)), and what the bridge's hook_embed applies after it (Granite's
    embedding_multiplier); 1.0 for none."""
    hf = getattr(bridge, "original_model", None)
    try:
        module = hf.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        module = None
    inside = getattr(module, "embed_scale", None)
    weight = getattr(module, "weight", None)
    if isinstance(inside, torch.Tensor):
        inside = inside.to(weight.dtype) if isinstance(weight, torch.Tensor) else inside
        inside = float(inside)
    after = getattr(getattr(bridge, "embed", None), "_output_contribution_scale", 1.0)
    return (float(inside) if isinstance(inside, (int, float)) else 1.0), float(after)


def module_score_scale(bridge: Any, d_head: int) -> float | None:
    """The attention scores' scale from the Hugging Face attention modules' own `scaling` (what their forward
    multiplies q k^T by) where every block's agrees and it is not 1/sqrt(d_head) (Gemma 2/3:
    query_pre_attn_scalar^-0.5); GPT-Neo's 1 (its scores are not scaled, and its modules hold no `scaling`); else
    None."""
    from headscope.models.hooked_model import raw_module  # it imports this module

    config = getattr(getattr(bridge, "original_model", None), "config", None)
    if getattr(config, "model_type", None) == "gpt_neo":  # GPTNeoSelfAttention multiplies q k^T by nothing (no `scaling`)
        return 1.0
    values = set()
    for block in getattr(bridge, "blocks", None) or []:
        attn = getattr(block, "attn", None)
        value = getattr(raw_module(attn), "scaling", None) if attn is not None else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        values.add(float(value))
    if len(values) != 1:
        return None
    value = values.pop()
    return None if math.isclose(value, d_head ** -0.5, rel_tol=1e-9) else value


def softcaps(config: Any) -> tuple[float | None, float | None]:
    """(final, attention): the config's final_logit_softcapping and attn_logit_softcapping, None where unset."""
    caps = (getattr(config, "final_logit_softcapping", None), getattr(config, "attn_logit_softcapping", None))
    return tuple(float(c) if isinstance(c, (int, float)) and c else None for c in caps)  # type: ignore[return-value]


def nope_layers(bridge: Any, config: Any, n_layers: int) -> tuple[int, ...]:
    """The layers that apply no rotary embedding (NoPE) on a rotary model (review 19c A1): those whose Hugging Face
    attention module has use_rope False (SmolLM3, Llama 4) or whose class's rule says so (Cohere2's and, with a
    sliding window, Exaone4's global layers: `_rotates`, review 20 A1), else those the config's no_rope_layers marks 0
    (1 means rotary there: HF's use_rope = config.no_rope_layers[layer]); () where every layer rotates."""
    from headscope.models.hooked_model import raw_module  # it imports this module

    blocks = list(getattr(bridge, "blocks", None) or [])[:n_layers]
    flags = [_rotates(raw_module(b.attn)) if getattr(b, "attn", None) is not None else None for b in blocks]
    if len(flags) == n_layers and all(isinstance(f, (bool, int)) for f in flags):
        return tuple(i for i, f in enumerate(flags) if not f)
    marks = getattr(config, "no_rope_layers", None)
    if isinstance(marks, Sequence) and len(marks) >= n_layers and all(isinstance(m, (bool, int)) for m in marks):
        return tuple(i for i in range(n_layers) if not marks[i])
    return ()


# Review 20 A1: the attention classes whose forward gates rotary on their own sliding window, HF's rule for each:
# Cohere2Attention rotates only where self.sliding_window is set (its sliding layers); Exaone4Attention where
# `self.sliding_window is None or self.is_sliding` (a hybrid model's global layers apply none).
ROTATES_BY_CLASS = {
    "Cohere2Attention": lambda a: getattr(a, "sliding_window", None) is not None,
    "Exaone4Attention": lambda a: getattr(a, "sliding_window", None) is None or bool(getattr(a, "is_sliding", False)),
}


def _rotates(attn: Any) -> bool | None:
    """Whether a Hugging Face attention module applies rotary: its use_rope flag (SmolLM3, Llama 4), else its class's
    rule (ROTATES_BY_CLASS); None where neither says (every layer rotates on a rotary model)."""
    flag = getattr(attn, "use_rope", None)
    if isinstance(flag, (bool, int)):
        return bool(flag)
    rule = ROTATES_BY_CLASS.get(type(attn).__name__)
    return rule(attn) if rule is not None else None


def nope_words(nope: Iterable[int] | None) -> str:
    """'no rotary (NoPE) on layers 1, 3': the layers whose attention has no position encoding of its own; '' for
    none."""
    layers = sorted(int(i) for i in nope or ())
    return f"no rotary (NoPE) on {_layers(layers)}" if layers else ""


def rope_bases(config: Any, n_layers: int, nope: Iterable[int] = ()) -> tuple[float | None, ...] | None:
    """Each layer's rotary base (rope_theta) from the config: rope_parameters by layer type (Gemma 3's
    {"sliding_attention": {...}, "full_attention": {...}} with layer_types), one rope_parameters / rope_theta for all
    layers otherwise; None where the config names none. None on the layers in `nope` (no rotary there, review 19c
    A1: SmolLM3's config names one rope_theta for every layer)."""
    bases = _rope_bases(config, n_layers)
    skip = set(nope)
    return None if bases is None else tuple(None if i in skip else b for i, b in enumerate(bases))


def _rope_bases(config: Any, n_layers: int) -> tuple[float, ...] | None:
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, Mapping) and params and all(isinstance(v, Mapping) for v in params.values()):
        types = getattr(config, "layer_types", None)
        if not isinstance(types, Sequence) or len(types) < n_layers:
            return None
        thetas = [(params.get(t) or {}).get("rope_theta") for t in types[:n_layers]]
        return tuple(float(t) for t in thetas) if all(isinstance(t, (int, float)) for t in thetas) else None
    theta = params.get("rope_theta") if isinstance(params, Mapping) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    return (float(theta),) * n_layers if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None


def _layers(ls: list[int]) -> str:
    return ("layer " if len(ls) == 1 else "layers ") + ", ".join(map(str, ls))


def rope_words(bases: Sequence[float] | None, windowed: Iterable[int] = ()) -> str:
    """'rotary base 10000 on layers 0, 1, 2 and 1e+06 on layer 3' where the layers' bases differ, else ''; where one
    base is on exactly the sliding-window layers (`windowed`) and another on the rest: 'rotary base 10000 on the
    sliding-window layers and 1e+06 on the global ones' (Gemma 3's 26 layers need no list)."""
    if not bases or len({b for b in bases if b is not None}) < 2:  # None: a NoPE layer (nope_words)
        return ""
    by: dict[float, list[int]] = {}
    for layer, base in enumerate(bases):
        if base is not None:
            by.setdefault(float(base), []).append(layer)
    local = set(windowed)
    if len(by) == 2 and local and any(set(ls) == local for ls in by.values()):
        (a, la), (b, _) = sorted(by.items(), key=lambda kv: set(kv[1]) != local)
        return f"rotary base {a:g} on the sliding-window layers and {b:g} on the global ones"
    parts = [f"{base:g} on {_layers(ls)}" for base, ls in by.items()]
    return "rotary base " + ", ".join(parts[:-1]) + " and " + parts[-1]


def cap_words(final: Any, attention: Any) -> list[str]:
    """['attention scores soft-capped: 3 tanh(score / 3)', 'final logits soft-capped: 5 tanh(logit / 5)'], those the
    model has."""
    words = []
    if isinstance(attention, (int, float)) and attention:
        words.append(f"attention scores soft-capped: {attention:g} tanh(score / {attention:g})")
    if isinstance(final, (int, float)) and final:
        words.append(f"final logits soft-capped: {final:g} tanh(logit / {final:g})")
    return words


def header_words(model: Mapping[str, Any]) -> list[str]:
    """The report header's phrases for the soft-caps and differing rotary bases, from the manifest's facts; and
    (review 18e C1) a squared activation's MLP and norms that apply their weight as 1 + w."""
    windowed = [int(k) for k in (model.get("attention_windows") or {})]
    act = model.get("mlp_act")
    mlp = ([f"{act} MLP ({SQUARED[act]}) without a gate"] if act in SQUARED and not model.get("gated_mlp")
           and not model.get("experts_per_layer") else [])
    norms = ["norms LayerNorm1P (weight applied as 1 + w)"] if model.get("norm_one_plus") is True else []
    if isinstance(model.get("norm_placement"), str):  # review 20d: Gemma 2/3's and Glm4's sandwich, OLMo 2/3's post-norm
        norms.append(f"norms {model['norm_placement']}")
    return cap_words(model.get("final_softcap"), model.get("attn_softcap")) + (
        [w] if (w := rope_words(model.get("rope_bases"), windowed)) else []) + (
        [w] if (w := nope_words(model.get("nope_layers"))) else []) + mlp + norms  # review 19c A1


# activations by TransformerLens / config name, as functions of float32 x (mlp_activation compares the model's own)
ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_new": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "relu2": lambda x: torch.relu(x) ** 2,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}
ACT_NAMES = ("act", "act_fn", "activation_fn", "activation", "intermediate_act_fn", "gelu_impl")  # HF MLPs' attribute


def mlp_activation(bridge: Any, configured: str | None) -> str | None:
    """The MLP activation's name as the first block's Hugging Face MLP module runs it (review 19a A2: TransformerLens
    gives MPT act_fn "relu" where HF's MptMLP runs exact GELU): `configured` (the bridge cfg's act_fn) where its
    function agrees with that module's activation on a probe from -4 to 4 (or either is unknown here), else the name
    of the one in ACTIVATIONS that agrees, else None (not read)."""
    from headscope.models.hooked_model import raw_module  # it imports this module

    blocks = getattr(bridge, "blocks", None)
    mlp = getattr(blocks[0], "mlp", None) if blocks is not None and len(blocks) else None
    raw = raw_module(mlp) if isinstance(mlp, torch.nn.Module) else None
    act = next((a for n in ACT_NAMES if callable(a := getattr(raw, n, None))), None)
    if act is None or (configured is not None and configured not in ACTIVATIONS):
        return configured
    x = torch.linspace(-4.0, 4.0, 81)  # [81]
    try:
        with torch.no_grad():
            y = act(x).float()
    except Exception:  # noqa: BLE001 - an activation that cannot take a plain float32 probe: the config's name
        return configured
    same = [n for n, f in ACTIVATIONS.items() if torch.allclose(f(x), y, atol=1e-5, rtol=0)]
    return configured if configured in same else (same[0] if same else None)


def positive_below_zero(bridge: Any) -> bool:
    """Whether the first block's ungated MLP activation gives positive outputs for negative inputs (Apertus's xIELU:
    (expm1(x) - x) alpha_n + beta x climbs back above 0 below about -2), read off the HF module on a probe from -8 to
    0: its coefficients then rank prefixes of large negative k_i . x among a neuron's top triggers (review 20b B1).
    False for ReLU, GELU, SiLU and the like (at most 0 there) and where the module is not read."""
    from headscope.models.hooked_model import raw_module  # it imports this module

    blocks = getattr(bridge, "blocks", None)
    mlp = getattr(blocks[0], "mlp", None) if blocks is not None and len(blocks) else None
    raw = raw_module(mlp) if isinstance(mlp, torch.nn.Module) else None
    act = next((a for n in ACT_NAMES if callable(a := getattr(raw, n, None))), None)
    if act is None or any(isinstance(getattr(raw, n, None), torch.nn.Module) for n in ("gate_proj", "w1", "gate")):
        return False
    x = torch.linspace(-8.0, -0.25, 32)  # [32]
    try:
        with torch.no_grad():
            p = next((q for q in act.parameters()), None) if isinstance(act, torch.nn.Module) else None
            y = act(x.to(p) if p is not None else x).float()
    except Exception:  # noqa: BLE001 - an activation that cannot take a plain probe: not read
        return False
    return bool((y > 1e-3).any())


SQUARED = {"relu2": "relu(x)^2"}  # activations whose memory coefficients are squares (Nemotron), by config name


def mlp_words(act: Any, gated: bool) -> str:
    """'relu2 = relu(x)^2, no gate', 'silu, gated' (act(x W_gate) * x W_in); '' where the activation is not read."""
    if not isinstance(act, str) or not act:
        return ""
    return f"{act}" + (f" = {SQUARED[act]}" if act in SQUARED else "") + (", gated" if gated else ", no gate")


def norm_one_plus(bridge: Any) -> bool:
    """Whether the model's norms apply their weight as 1 + w: Nemotron's LayerNorm1P (by its class name)."""
    model = getattr(bridge, "original_model", None)
    return isinstance(model, torch.nn.Module) and any(
        type(m).__name__.lower().endswith("layernorm1p") for m in model.modules())


def repr_words(facts: Any, windowed: Iterable[int] = ()) -> str:
    """print(model)'s fields for the same facts, each with ', ' after: 'embed_scale=8, attention_scale=0.204124 (not
    1/sqrt(16)), rope_theta=(10000 on the sliding-window layers; 1e+06 on the global ones), final_logit_softcap=5, '."""
    out = ""
    if facts.embed_scale != 1.0:
        out += f"embed_scale={facts.embed_scale:g}, "
    if facts.attention_scale is not None:
        width = (facts.mla or {}).get("d_head_qk") or facts.d_head
        out += f"attention_scale={facts.attention_scale:.6g} (not 1/sqrt({width})), "
    if words := rope_words(facts.rope_bases, windowed):
        out += "rope_theta=(" + words.removeprefix("rotary base ").replace(" and ", "; ") + "), "
    if words := nope_words(getattr(facts, "nope_layers", ())):  # review 19c A1
        out += words + ", "
    if getattr(facts, "norm_placement", None):
        out += f"norms={facts.norm_placement}, "
    if facts.attn_softcap:
        out += f"attn_softcap={facts.attn_softcap:g}, "
    if facts.final_softcap:
        out += f"final_logit_softcap={facts.final_softcap:g}, "
    return out


def norm_placement(bridge: Any) -> str | None:
    """Where every block's norms sit, where it is not the usual pre-norm: 'before and after each sublayer' (Gemma 2/3,
    Glm4: ln1/ln2 and ln1_post/ln2_post on every block of the bridge), 'after each sublayer only' (OLMo 2/3:
    ln1_post/ln2_post without ln1/ln2); None otherwise (review 20d B: the header said neither)."""
    blocks = list(getattr(bridge, "blocks", None) or [])
    if not blocks:
        return None
    has = lambda b, n: getattr(b, n, None) is not None  # noqa: E731
    if not all(has(b, "ln1_post") and has(b, "ln2_post") for b in blocks):
        return None
    if all(has(b, "ln1") and has(b, "ln2") for b in blocks):
        return "before and after each sublayer"
    if not any(has(b, "ln1") or has(b, "ln2") for b in blocks):
        return "after each sublayer only"
    return None


SANDWICH = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def norms_before_and_after(bridge: Any) -> bool:
    """Whether every block norms both the input and the output of its attention and of its MLP (Gemma 2/3's four norms
    per block, by their Hugging Face names; Llama's post_attention_layernorm alone is its pre-MLP norm)."""
    from headscope.models.hooked_model import raw_module  # it imports this module

    blocks = list(getattr(bridge, "blocks", None) or [])
    return bool(blocks) and all(all(isinstance(getattr(raw_module(b), n, None), torch.nn.Module) for n in SANDWICH)
                                for b in blocks)


def tl_config_fields(facts: Any, windows: Sequence[int | None], embed_inside: float) -> dict[str, Any]:
    """TransformerLens config fields as its HookedTransformer configs give them for this model (Gemma 2/3's:
    attn_scale the scores' divisor sqrt(query_pre_attn_scalar), use_qk_norm, window_size, use_local_attn, attn_types
    "local"/"global" per layer, rotary_base the global layers' base and rotary_base_local the sliding ones' where
    they differ, scale_embedding where the embedding is x sqrt(d_model)); only fields the facts decide."""
    out: dict[str, Any] = {}
    if facts.attention_scale == 1.0:  # GPT-Neo: TransformerLens's own config for it turns the scale off
        out.update(use_attn_scale=False, attn_scale=1.0)
    elif facts.attention_scale is not None:
        out.update(use_attn_scale=True, attn_scale=1.0 / facts.attention_scale)
    if facts.qk_norm:
        out["use_qk_norm"] = True
    sizes = {w for w in windows if w is not None}
    if len(sizes) == 1:
        out.update(window_size=sizes.pop(), use_local_attn=True,
                   attn_types=["global" if w is None else "local" for w in windows])
    if facts.positional == "rotary" and facts.rope_bases and any(b is not None for b in facts.rope_bases):
        local = [b for b, w in zip(facts.rope_bases, windows) if w is not None and b is not None]
        full = [b for b, w in zip(facts.rope_bases, windows) if w is None and b is not None] or local
        integral = lambda b: int(b) if float(b).is_integer() else b  # noqa: E731  TransformerLens keeps an int
        out["rotary_base"] = integral(full[0])
        if local and set(local) != set(full):
            out["rotary_base_local"] = integral(local[0])
    if getattr(facts, "nope_layers", ()):  # review 19c A1: no TransformerLens field says it; headscope's own
        out["nope_layers"] = list(facts.nope_layers)
    if isinstance(getattr(facts, "mlp_act", None), str) and facts.mlp_act in ACTIVATIONS:  # review 20b C (MPT):
        out["act_fn"] = facts.mlp_act  # the activation the HF MLP runs (mlp_activation), where TransformerLens said another
    if embed_inside != 1.0 and math.isclose(embed_inside, facts.d_model ** 0.5, rel_tol=2 ** -8):  # bfloat16's step
        out["scale_embedding"] = True
    return out
