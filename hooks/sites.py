"""Site names: TransformerLens hook names, built by a typed helper and documented in one table.

A *site* is a named activation inside the model. Names are TransformerLens's exactly
(`blocks.3.attn.hook_pattern`). `site("pattern", 3)` builds one; `check_site(model, name)`
validates one against a loaded model (unknown names get the closest valid names suggested,
layers out of range get the valid range). `hook_result` (per-head output) is computed by
headscope from hook_z and W_O, so it exists for every architecture.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from headscope.errors import IndexOutOfRangeError, SiteError, did_you_mean
from headscope.models.hooked_model import is_parallel


@dataclass(frozen=True, kw_only=True)
class SiteKind:
    template: str  # "{layer}" is replaced by the layer index
    shape: str  # documented shape
    doc: str
    pos_dim: int = 1  # which axis is the (query) position
    head_dim: int | None = None  # which axis is the head, if any
    flat: bool = False  # the hook point sees [batch * pos, ...]; capture gives [batch, pos, ...]


SITES: dict[str, SiteKind] = {
    "embed": SiteKind(template="hook_embed", shape="[batch, pos, d_model]", doc="token embeddings"),
    "pos_embed": SiteKind(template="hook_pos_embed", shape="[batch, pos, d_model]",
                          doc="learned position embeddings (GPT-2, BERT)"),
    "resid_pre": SiteKind(template="blocks.{layer}.hook_resid_pre", shape="[batch, pos, d_model]",
                          doc="residual stream into the block"),
    "resid_mid": SiteKind(template="blocks.{layer}.hook_resid_mid", shape="[batch, pos, d_model]",
                          doc="residual stream between attention and MLP"),
    "resid_post": SiteKind(template="blocks.{layer}.hook_resid_post", shape="[batch, pos, d_model]",
                           doc="residual stream out of the block"),
    "attn_out": SiteKind(template="blocks.{layer}.hook_attn_out", shape="[batch, pos, d_model]",
                         doc="attention output as added to the residual stream (sum of heads + bias; post-norm "
                             "blocks, Gemma 2/3 and OLMo 2: after the post-attention norm)"),
    "mlp_out": SiteKind(template="blocks.{layer}.hook_mlp_out", shape="[batch, pos, d_model]",
                        doc="MLP output as added to the residual stream (post-norm blocks: after the post-MLP norm)"),
    "q": SiteKind(template="blocks.{layer}.attn.hook_q", shape="[batch, pos, head, d_head]", doc="queries", head_dim=2),
    "k": SiteKind(template="blocks.{layer}.attn.hook_k", shape="[batch, pos, kv_head, d_head]",
                  doc="keys (n_kv_heads under grouped-query attention)", head_dim=2),
    "v": SiteKind(template="blocks.{layer}.attn.hook_v", shape="[batch, pos, kv_head, d_head]",
                  doc="values (n_kv_heads under grouped-query attention)", head_dim=2),
    "rot_q": SiteKind(template="blocks.{layer}.attn.hook_rot_q", shape="[batch, pos, head, d_head]",
                      doc="queries after RoPE (rotary models)", head_dim=2),
    "rot_k": SiteKind(template="blocks.{layer}.attn.hook_rot_k", shape="[batch, pos, kv_head, d_head]",
                      doc="keys after RoPE (rotary models); what the KV cache stores", head_dim=2),
    "scores": SiteKind(template="blocks.{layer}.attn.hook_attn_scores", shape="[batch, head, query_pos, key_pos]",
                       doc="scaled, masked attention scores (soft-capped before the mask where the model caps "
                           "them, Gemma 2; masked entries hold the dtype's minimum, not -inf)", pos_dim=2, head_dim=1),
    "pattern": SiteKind(template="blocks.{layer}.attn.hook_pattern", shape="[batch, head, query_pos, key_pos]",
                        doc="attention weights (softmax of scores)", pos_dim=2, head_dim=1),
    "z": SiteKind(template="blocks.{layer}.attn.hook_z", shape="[batch, pos, head, d_head]",
                  doc="per-head mix of values (pattern @ v)", head_dim=2),
    "result": SiteKind(template="blocks.{layer}.attn.hook_result", shape="[batch, pos, head, d_model]",
                       doc="per-head output z @ W_O (computed by headscope; post-norm blocks: before the "
                           "post-attention norm)", head_dim=2),
    "mlp_pre": SiteKind(template="blocks.{layer}.mlp.hook_pre", shape="[batch, pos, d_mlp]",
                        doc="MLP pre-activation (gate projection for gated MLPs)"),
    "mlp_pre_linear": SiteKind(template="blocks.{layer}.mlp.hook_pre_linear", shape="[batch, pos, d_mlp]",
                               doc="up projection of a gated MLP"),
    "mlp_post": SiteKind(template="blocks.{layer}.mlp.hook_post", shape="[batch, pos, d_mlp]",
                         doc="MLP memory coefficients (act(pre), gated: act(gate) * up; mixtures of experts: "
                             "every expert's neurons, each weighted by the router and 0 on tokens not routed "
                             "to its expert, computed by headscope from the MLP's input, hooks.memories)"),
    "router_logits": SiteKind(template="blocks.{layer}.mlp.gate.hook_out", shape="[batch, pos, expert]",
                              doc="a mixture-of-experts router's logits", flat=True),
    "expert_weights": SiteKind(template="blocks.{layer}.mlp.hook_expert_weights", shape="[batch, pos, expert]",
                               doc="each token's weight on each expert, as the MoE block mixes them (0 on "
                                   "experts it did not choose)", flat=True),
    "expert_indices": SiteKind(template="blocks.{layer}.mlp.hook_expert_indices", shape="[batch, pos, top_k]",
                               doc="the experts each token chose (router's top k)", flat=True),
}

SCORES_AS_WEIGHTS = ("on this model the attention weights after softmax, equal to pattern: TransformerLens hands "
                     "attention to the Hugging Face module, which returns weights, not scores")


MASKED = "masked entries hold the dtype's minimum, as Hugging Face's additive mask gives, not -inf"


def qkv_words(facts, kind: str) -> str | None:
    """Review 18c A1/C2: what stands between a layer's projection and its q/k/v site where a norm over all heads or
    a clamp runs there (OLMo 2, OLMoE; models/qkv_sites.py moves both before the hook), e.g. 'after the q/k RMSNorm
    over all heads and the clamp to +-2 (clip_qkv): what attention uses, per head'; None elsewhere."""
    if kind not in ("q", "k", "v"):
        return None
    norm = getattr(facts, "qk_norm", None) if kind != "v" else None
    norm = norm if isinstance(norm, str) and norm.endswith("over all heads") else None
    clip = getattr(facts, "clip_qkv", None)
    parts = ([f"the q/k {norm}"] if norm else []) + ([f"the clamp to +-{clip:g} (clip_qkv)"] if clip is not None else [])
    return f"after {' and '.join(parts)}: what attention uses, per head" if parts else None


def per_head_norm(facts) -> str | None:
    """The q/k norm where it is one per head ('RMSNorm per head': Qwen3, Gemma 3, Exaone4, StableLM, Cohere), which
    TransformerLens runs between hook_q/hook_k and the rotary (hook_rot_q/hook_rot_k); None elsewhere."""
    norm = getattr(facts, "qk_norm", None)
    return norm if isinstance(norm, str) and norm.endswith("per head") else None


def qk_norm_site_words(facts, kind: str, layer: int | None = None) -> str | None:
    """Review 20 A2: on a per-head q/k norm (per_head_norm), what q/k and rot_q/rot_k hold: q 'the projection's
    output per head, before the q/k RMSNorm per head and rotary; hook_q_normed holds it after the norm' (k alike);
    rot_q, rot_k 'after the q/k RMSNorm per head and RoPE', and on NoPE layers (ModelFacts.nope_layers) that they
    hold the normed q/k unrotated, not q/k; None for other sites and models."""
    from headscope.models.config_facts import _layers

    norm = per_head_norm(facts)
    if norm is None or kind not in ("q", "k", "rot_q", "rot_k"):
        return None
    x = kind[-1]
    if kind in ("q", "k"):
        return f"the projection's output per head, before the q/k {norm} and rotary; hook_{x}_normed holds it after the norm"
    nope = sorted(getattr(facts, "nope_layers", ()) or ())
    if layer is not None and layer in nope:
        return f"{x} after the q/k {norm}, unrotated: no rotary (NoPE) on this layer; not equal to {x}, which is before the norm"
    words = f"after the q/k {norm} and RoPE"
    if nope and layer is None:
        words += f"; on {_layers(nope)} after the norm only, unrotated: no rotary (NoPE) there"
    return words


def nope_site_words(facts, kind: str, layer: int | None = None) -> str | None:
    """Review 19c A2: on a model with NoPE layers (ModelFacts.nope_layers: SmolLM3, Llama 4), what rot_q / rot_k hold
    there: 'equal to q on layers 1, 3: no rotary (NoPE) there' (layer None), 'equal to q: no rotary (NoPE) on this
    layer' (a NoPE layer); None for other sites, layers and models."""
    from headscope.models.config_facts import _layers

    nope = sorted(getattr(facts, "nope_layers", ()) or ())
    if kind not in ("rot_q", "rot_k") or not nope or (layer is not None and layer not in nope):
        return None
    if layer is not None:
        return f"equal to {kind[-1]}: no rotary (NoPE) on this layer"
    return f"equal to {kind[-1]} on {_layers(nope)}: no rotary (NoPE) there"


def describe_site(kind: str, mla: dict | None = None, scores_hold_weights: bool = False, facts=None, *,
                  post_norms: tuple[str, ...] | list[str] | None = None,
                  score_softcap: float | None = None, layer: int | None = None) -> tuple[str, str]:
    """(shape, doc) of a site kind (at `layer`; None: any) for the sites table; on multi-head latent attention (facts.mla) the
    q/k/v/rot sites' true widths and what the cache holds (HF's DeepseekV3Attention caches the normed latent and
    the one roped key, and expands per-head K/V from them; review 16v C2). scores_hold_weights
    (hooks.edits.scores_hold_weights): the scores site holds the softmax weights there (review 17d A3).
    With a model's facts (review 18d A2) the docs say what this model's hook holds: post_norms
    (hooks.post_norm.post_norms: "post-attention", "post-MLP") and score_softcap (attn_softcap: Gemma 2's
    attn_logit_softcapping c, the scores c * tanh(s / c) before the mask); None: the generic SITES docs."""
    if kind == "scores" and scores_hold_weights:
        return SITES[kind].shape, SCORES_AS_WEIGHTS
    # review 19a C3: on ALiBi (BLOOM, MPT) the scores hold the position bias too, added before the softmax
    bias = (" plus ALiBi's position bias (each head's slope x the key's position: in each query's row -slope x the "
            "query-key distance up to a constant, which the softmax ignores)") if getattr(
        facts, "positional", None) == "alibi" else ""
    if kind == "scores" and bias and score_softcap is None:
        return SITES[kind].shape, f"scaled attention scores{bias}, masked ({MASKED})"
    if post_norms is not None or score_softcap is not None:
        norms = post_norms or ()
        specific = {
            "attn_out": ("attention output after the block's post-attention norm, as added to the residual stream "
                         "(the norm of the heads' sum + bias)") if "post-attention" in norms else
                        "attention output as added to the residual stream (sum of heads + bias)",
            "mlp_out": "MLP output after the block's post-MLP norm, as added to the residual stream"
                       if "post-MLP" in norms else "MLP output as added to the residual stream",
            "result": ("per-head output z @ W_O, before the post-attention norm (computed by headscope; "
                       "cache.stack_head_results gives each head's write through the norm)")
                      if "post-attention" in norms else "per-head output z @ W_O (computed by headscope)",
            "scores": (f"scaled attention scores soft-capped to {score_softcap:g} * tanh(s / {score_softcap:g}), "
                       f"then masked ({MASKED})") if score_softcap is not None else
                      f"scaled, masked attention scores ({MASKED})",
        }
        if kind in specific:
            return SITES[kind].shape, specific[kind]
    if not mla or kind not in ("q", "k", "v", "rot_q", "rot_k"):
        after = qkv_words(facts, kind) if facts is not None else None  # facts: the model's (clip_qkv, qk_norm)
        after = after or (qk_norm_site_words(facts, kind, layer) if facts is not None else None)  # review 20 A2
        after = after or (nope_site_words(facts, kind, layer) if facts is not None else None)
        return SITES[kind].shape, SITES[kind].doc + (f" ({after})" if after else "")
    qk, rope, v, latent = mla["d_head_qk"], mla["d_head_rope"], mla["d_head_v"], mla["kv_lora_rank"]
    return {
        "q": (f"[batch, pos, head, {qk}]", f"queries ({qk - rope} unrotated + {rope} rotary)"),
        "k": (f"[batch, pos, head, {qk}]", f"per-head keys: {qk - rope} numbers expanded from the cached latent, "
                                           f"then the {rope} of the shared rotary key; not cached"),
        "v": (f"[batch, pos, head, {v}]", "per-head values expanded from the cached latent; not cached"),
        "rot_q": (f"[batch, pos, head, {rope}]", "the queries' rotary part after RoPE"),
        "rot_k": (f"[batch, pos, 1, {rope}]", f"the rotary key after RoPE, one shared by all heads; the KV cache "
                                              f"stores it and the normed latent ({latent} wide), not per-head keys"),
    }[kind]


def attn_softcap(model) -> float | None:
    """The model's attention-score soft-cap c (Gemma 2's config.attn_logit_softcapping: scores c * tanh(s / c)
    before the mask, as hook_attn_scores holds them), None without one."""
    config = getattr(getattr(model.bridge, "original_model", None), "config", None)
    cap = getattr(config, "attn_logit_softcapping", None)
    return float(cap) if cap else None


COMPUTED = {"result"}  # sites headscope computes rather than reads from a hook point
ROUTER_SITES = ("expert_weights", "expert_indices")  # where the bridge has no such hook point (DeepSeek-V3's router):
# computed by headscope from the MLP's input with Hugging Face's router (hooks.memories.moe_routing, review 15d C5)


def routed_source(name: str, hook_names) -> str | None:
    """The MLP input hook point a router site is computed from where the bridge lacks it; None otherwise."""
    kind, layer = parse_site(name)
    return f"blocks.{layer}.mlp.hook_in" if kind in ROUTER_SITES and name not in hook_names else None
_NAME = re.compile(r"^blocks\.(\d+)\.(.+)$")


# TransformerLens's short names (transformer_lens.utilities.get_act_name's alias table, 4.3, and its
# own spellings of the kinds headscope names differently) -> headscope site kinds
ALIASES = {
    "attn": "pattern", "attn_scores": "scores", "attn_logits": "scores", "key": "k", "query": "q",
    "value": "v", "pre": "mlp_pre", "post": "mlp_post", "pre_linear": "mlp_pre_linear",
}


def site(kind: str, layer: int | None = None, *, model=None) -> str:
    """The TransformerLens name of a site: site("pattern", 3) -> "blocks.3.attn.hook_pattern".

    kind: a SITES kind or a TransformerLens short name (ALIASES: site("attn", 1) is the pattern, as
    get_act_name gives). A negative layer counts from the last one and needs the model, which knows
    how many there are: site("resid_pre", -1, model=model); without a model it is refused in one
    line (names stay plain strings, resolved when built). With a model, a layer past the last is
    refused too.
    """
    kind = ALIASES.get(kind, kind)
    if kind not in SITES:
        raise SiteError(
            f"Unknown site kind {kind!r}. Did you mean {_suggest(kind, [*SITES, *ALIASES])}? "
            f"Valid kinds: {', '.join(SITES)}."
        )
    template = SITES[kind].template
    if "{layer}" in template:
        if layer is None:
            raise SiteError(f"Site kind {kind!r} is per layer; pass layer=, e.g. site({kind!r}, 0).")
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise IndexOutOfRangeError(f"layer must be an int, got {layer!r}.")
        n = model.facts.n_layers if model is not None else None
        if layer < 0 and n is None:
            raise IndexOutOfRangeError(
                f"site({kind!r}, {layer}): a negative layer counts from the last layer, which needs the model; pass "
                f"it: site({kind!r}, {layer}, model=model) (or index a cache: acts[{kind!r}, {layer}])."
            )
        if n is not None and not -n <= layer < n:
            raise IndexOutOfRangeError(f"layer {layer} is out of range: {model.facts.name} has layers 0..{n - 1} "
                                       f"(or -{n}..-1 from the end).")
        return template.format(layer=layer % n if n is not None else layer)
    return template


def split_block(name: str) -> tuple[int, str] | None:
    """A hook name inside a block split into (layer, name within it): "blocks.3.attn.hook_z" ->
    (3, "attn.hook_z"); None outside the blocks (e.g. "hook_embed")."""
    match = _NAME.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def parse_site(name: str) -> tuple[str, int | None]:
    """Inverse of `site`: "blocks.3.attn.hook_pattern" -> ("pattern", 3). SiteError if unknown."""
    layer, rest = split_block(name) or (None, name)
    for kind, spec in SITES.items():
        template = spec.template
        if layer is None and template == rest:
            return kind, None
        if layer is not None and template == "blocks.{layer}." + rest:
            return kind, layer
    raise SiteError(f"Unknown site {name!r}. Did you mean {_suggest(name, _all_templates())}?")


def check_site(model, name: str) -> str:
    """Validate a site name against a loaded model and return it unchanged.

    Raises SiteError for unknown names (with the closest valid names) and IndexOutOfRangeError
    for a layer outside the model.
    """
    block = split_block(name)
    if block:
        layer = block[0]
        if layer >= model.facts.n_layers:
            raise IndexOutOfRangeError(
                f"Site {name!r} names layer {layer}, but {model.facts.name} has layers 0..{model.facts.n_layers - 1}."
            )
    valid = available_sites(model)
    if name not in valid and name in _hook_table(model):
        raise SiteError(
            f"Site {name!r} is a TransformerLens hook point that {model.facts.name} ({model.facts.family}) "
            f"never computes, so it cannot be captured or patched; use one of {_suggest(name, valid)}."
        )
    blocks = getattr(getattr(model, "bridge", None), "blocks", None)
    if name not in valid and name.endswith(".hook_resid_mid") and block and blocks is not None \
            and is_parallel(blocks[block[0]]):
        # review 8 C1: a parallel block (GPT-NeoX, GPT-J) has no state between attention and MLP
        raise SiteError(f"Site {name!r}: block {block[0]} of {model.facts.name} has no resid_mid: attention and MLP run "
                        "in parallel (both read the block's input), so there is no state between them; use "
                        f"{_suggest(name, valid)}.")
    if name not in valid:
        raise SiteError(
            f"Unknown site {name!r} for {model.facts.name}. Did you mean {_suggest(name, valid)}? "
            f"See headscope.hooks.SITES for the table of site kinds."
        )
    return name


def available_sites(model) -> list[str]:
    """Every site name of the SITES table that this model exposes (hook points plus computed);
    remembered on the model."""
    cached = getattr(model, "_headscope_available_sites", None)
    if cached is not None:
        return list(cached)
    hook_names = set(_hook_table(model))
    if model.facts.positional != "standard":
        hook_names.discard("hook_pos_embed")  # an alias that never fires without learned positions
    kinds_global = [k for k, spec in SITES.items() if "{layer}" not in spec.template]
    kinds_layer = [k for k, spec in SITES.items() if "{layer}" in spec.template]
    from headscope.hooks.memories import is_moe

    moe = [is_moe(model, layer) for layer in range(model.facts.n_layers)]
    candidates = [site(k) for k in kinds_global] + [  # router sites on MoE layers only (a gated MLP's gate is no router)
        site(k, layer) for layer in range(model.facts.n_layers) for k in kinds_layer if moe[layer] or not SITES[k].flat
    ]
    point = {n: (site("z", parse_site(n)[1]) if parse_site(n)[0] in COMPUTED else
                 n if n in hook_names else routed_source(n, hook_names)) for n in candidates}
    fired = _fired_hook_points(model, [n for n in candidates if point[n] in hook_names])
    found = [n for n in candidates if point[n] in fired]
    model._headscope_available_sites = tuple(found)
    return found


def hook_point(model, name: str):
    """The bridge's HookPoint called `name` (None if there is none)."""
    return _hook_table(model).get(name)


def _hook_table(model) -> dict:
    """The bridge's hook points by name, built once per model (the bridge's hook_dict walks every
    module on each access)."""
    table = getattr(model, "_headscope_hook_points", None)
    if table is None:
        table = model._headscope_hook_points = dict(model.bridge.hook_dict)
    return table


def _fired_hook_points(model, names: list[str]) -> set[str]:
    """Hook points that actually fire in a forward pass (some bridges expose points they never call).

    Probed once per model with a two-token input and remembered on the model.
    """
    cached = getattr(model, "_headscope_fired_sites", None)
    if cached is not None:
        return cached
    import torch

    fired: set[str] = set()
    hook_names = set(_hook_table(model))
    points = {site("z", parse_site(n)[1]) if parse_site(n)[0] in COMPUTED else routed_source(n, hook_names) or n
              for n in names}

    def recorder(name: str):
        return lambda act, hook: fired.add(name)

    probe = torch.zeros((1, 2), dtype=torch.long)
    with torch.no_grad():
        model.run_with_hooks(probe, fwd=[(name, recorder(name)) for name in sorted(points)])
    model._headscope_fired_sites = fired
    return fired


def _all_templates() -> list[str]:
    return [s.template.replace("{layer}", "0") for s in SITES.values()]


_suggest = did_you_mean  # the close-name suggestions every site, key and hook-name error shares
