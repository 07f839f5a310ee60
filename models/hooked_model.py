"""HookedModel: a TransformerBridge plus its tokenizer and the config facts analyses need.

The bridge (TransformerLens 4.x) wraps a Hugging Face model and exposes every internal site as
a TransformerLens hook point. HookedModel adds what analyses need around it: the facts of the
architecture in one frozen record, tokenisation, input checks (context length, token range),
and one call convention: logits for decoders, final hidden states for encoders (MiniLM has no
trained LM head, and TransformerLens gives BERT a random one).
"""
from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from headscope.errors import (
    ConfigError,
    ContextLengthError,
    IndexOutOfRangeError,
    InputTypeError,
    PaddingError,
    TokenizationError,
    TokenizationWarning,
)
from headscope.models import attention_layout, config_facts, heap, particulars, qkv_sites
from headscope.models.readout import is_post_ln_block, unembed_weight
from headscope.models.tl_habits import TLHabits
from headscope.models.token_text import token_strings, unknown_words

_FAMILIES = {
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "GPTNeoXForCausalLM": "neox",
    "BertForMaskedLM": "bert",
    "BertModel": "bert",
}


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """Architecture facts, read once from the bridge's config."""

    name: str
    family: str  # "gpt2", "llama", "neox", "bert", or the HF architecture name
    architecture: str
    is_encoder: bool
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int  # the length analyses size their own prompts to; the model's limit only where fixed_context
    gated_mlp: bool
    positional: str  # "standard" (learned), "rotary", ...
    # The model's own scalings of its stream and logits (muP-style: Granite's embedding_multiplier,
    # residual_multiplier, attention_multiplier, logits_scaling; Cohere's logit_scale). The bridge's
    # hook_embed, hook_attn_out, hook_mlp_out and head results already carry embed_scale and
    # residual_scale; weights (W_U, W_out) do not, so whatever unembeds or forms writes by hand reads these.
    logit_scale: float = 1.0  # logits = logit_scale * (final normed stream @ W_U + b_U), before any soft-cap
    residual_scale: float = 1.0  # each block's attention and MLP output x this before the residual add
    embed_scale: float = 1.0  # the token embedding x this before the first block (Gemma's sqrt(d_model) included)
    # the scores' scale where not 1/sqrt(d_head): the config's, MLA's (q/k width), or the attention modules' own
    # `scaling` (Gemma 2/3's query_pre_attn_scalar^-0.5; review 18b A4)
    attention_scale: float | None = None
    # Review 18b A4/C1 (models/config_facts.py): the final-logit and attention-score soft-caps (cap * tanh(x / cap),
    # Gemma 2/3), None without; each layer's rotary base (Gemma 3: 1e4 sliding, 1e6 global), None where not read.
    final_softcap: float | None = None
    attn_softcap: float | None = None
    rope_bases: tuple[float | None, ...] | None = None  # None on a NoPE layer
    # Review 19c A1: the layers that apply no rotary (SmolLM3 / Llama 4 no_rope_layers): they see positions only
    # through the causal mask, and their hook_rot_q / hook_rot_k equal hook_q / hook_k. () where every layer rotates.
    nope_layers: tuple[int, ...] = ()
    # Multi-head latent attention (DeepSeek-V2/V3: the config has kv_lora_rank): q/k heads d_head_qk wide
    # (qk_nope + qk_rope_dim rotary), v heads and z d_head (= v_head_dim) wide, K/V expanded from a kv_lora_rank
    # latent, q from a q_lora_rank one (None: q projected directly). All None on other attention.
    mla: dict[str, int | None] | None = field(default=None, hash=False)  # out of the hash: a dict
    # Review 16c A2: False where the HF config names no maximum length (BLOOM's ALiBi): n_ctx is then
    # TransformerLens's default, a working length, not a limit; no prompt is refused for its length.
    fixed_context: bool = True

    @property
    def context_limit(self) -> int | None:
        """The longest prompt the model takes (n_ctx), None where it has no fixed context."""
        return self.n_ctx if self.fixed_context else None

    @property
    def context_words(self) -> str:
        """'2048', or 'none (ALiBi: no fixed context)' where the config names no maximum length."""
        if self.fixed_context:
            return str(self.n_ctx)
        return "none (" + ("ALiBi: " if self.positional == "alibi" else "") + "no fixed context)"
    # Post-LN blocks (OPT with do_layer_norm_before=False: each block's LayerNorm normalises the whole stream after
    # every add, no final norm): no linear read of the stream into the logits (models/readout.py). Review 16d A4.
    post_ln: bool = False
    # The token embedding's width where it is projected into the stream (OPT-350m's word_embed_proj_dim:
    # project_in [d_embed -> d_model], project_out back before the unembedding); None where it is d_model.
    d_embed: int | None = None
    # Review 17a C3 (models/attention_layout.py): the dims of each head rotary turns where fewer than d_head
    # (StableLM's partial_rotary_factor 0.25: 4 of 16), and the q/k norm ("LayerNorm per head"), else None.
    rotary_dims: int | None = None
    rotary_interleaved: bool = False  # review 20d: Glm4 turns dims (2i, 2i + 1) (attention_layout.interleaved_rotary)
    norm_placement: str | None = None  # review 20d: "before and after each sublayer" (Gemma 2/3, Glm4), "after ..."
    qk_norm: str | None = None
    # Review 18c A5: OLMo / OLMoE clamp q, k and v to +-clip_qkv after the projection (and q/k norm), MPT its fused
    # Wqkv output to +-attn_config.clip_qkv (review 19a A1); None: no clamp.
    clip_qkv: float | None = None
    # Review 18e C1: the MLP's activation (the config's name: "relu2" is Nemotron's squared ReLU, relu(x)^2), None
    # where not read; and whether the norms apply their weight as 1 + w (Nemotron's LayerNorm1P).
    mlp_act: str | None = None
    norm_one_plus: bool = False
    # Review 19b (models/particulars.py): a learned per-head sink logit in each row's softmax (GPT-OSS's `sinks`: rows
    # over the keys sum to < 1), attention biases, rope scaling ("YaRN rope scaling (factor 32)"), the experts' own
    # activation where they ignore hidden_act ("clamped SwiGLU (limit 7, alpha 1.702, up + 1)").
    learned_sinks: bool = False
    attention_bias: bool = False
    attention_bias_on: tuple[str, ...] = ()  # review 20d A1: which projections carry one ("q", "k", "v", "output")
    rope_scaling: str | None = None
    expert_act: str | None = None

    @property
    def attention_layout(self) -> str:
        """'multi-head latent attention' or 'multi-head attention'."""
        return "multi-head latent attention" if self.mla else "multi-head attention"

    @property
    def n_total_heads(self) -> int:
        return self.n_layers * self.n_heads


def output_logit_scale(bridge: Any) -> float:
    """The linear factor the architecture applies to x @ W_U + b_U (Granite 1 / logits_scaling, Cohere
    logit_scale), read from the adapter's own post-unembedding transform (the bridge's
    `apply_output_logits_transform`) at a small probe, where a final soft-cap (Gemma 2, applied separately,
    `circuits.lens.final_softcap`) has slope 1; 1.0 where the adapter declares none."""
    adapter = getattr(bridge, "adapter", None)
    transform = getattr(adapter, "apply_output_logits_transform", None)
    if transform is None:
        return 1.0
    probe = torch.tensor([1e-6], dtype=torch.float64)
    try:
        slope = float(transform(probe.clone())[0]) / 1e-6
    except Exception:  # noqa: BLE001 - an adapter that cannot take a probe declares no scale we can read
        return 1.0
    return 1.0 if abs(slope - 1.0) < 1e-9 else float(f"{slope:.12g}")


def facts_from_bridge(bridge: Any, name: str) -> ModelFacts:
    cfg = bridge.cfg
    arch = str(cfg.architecture)
    is_encoder = getattr(cfg, "attention_dir", "causal") == "bidirectional" or arch.startswith("Bert")
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    mla = mla_layout(bridge)
    hf = config_facts.hf_text_config(bridge)
    caps = config_facts.softcaps(hf)
    rotary = str(getattr(cfg, "positional_embedding_type", "")) == "rotary"
    nope = config_facts.nope_layers(bridge, hf, int(cfg.n_layers)) if rotary else ()  # review 19c A1
    return ModelFacts(
        name=name,
        family=_FAMILIES.get(arch, arch),
        architecture=arch,
        is_encoder=bool(is_encoder),
        n_layers=int(cfg.n_layers),
        n_heads=int(cfg.n_heads),
        n_kv_heads=int(n_kv),
        d_model=int(cfg.d_model),
        d_head=int(mla["d_head_v"]) if mla else int(cfg.d_head),
        d_mlp=_mlp_width(bridge, int(cfg.d_mlp)),
        d_vocab=int(cfg.d_vocab),
        n_ctx=int(cfg.n_ctx),
        gated_mlp=bool(getattr(cfg, "gated_mlp", False)),
        # review 19a A2: the HF module's activation where TransformerLens's act_fn names another (MPT: GELU, not relu)
        mlp_act=config_facts.mlp_activation(bridge, str(cfg.act_fn) if isinstance(getattr(cfg, "act_fn", None), str)
                                            else None),
        norm_one_plus=config_facts.norm_one_plus(bridge),
        positional=str(getattr(cfg, "positional_embedding_type", "standard")),
        logit_scale=output_logit_scale(bridge),
        residual_scale=_residual_scale(bridge),
        embed_scale=math.prod(config_facts.embedding_scales(bridge)),  # Gemma's x sqrt(d_model) (review 18b A4)
        attention_scale=_attention_multiplier(bridge, None if mla else int(cfg.d_head)),
        mla=mla,
        fixed_context=config_names_context(getattr(getattr(bridge, "original_model", None), "config", None)),
        post_ln=any(is_post_ln_block(b) for b in getattr(bridge, "blocks", None) or []),
        d_embed=_projected_embedding(bridge, int(cfg.d_model)),
        final_softcap=caps[0], attn_softcap=caps[1],
        rope_bases=config_facts.rope_bases(hf, int(cfg.n_layers), nope) if rotary else None,
        nope_layers=nope,
        **_attention_facts(bridge, None if mla else int(cfg.d_head), str(getattr(cfg, "positional_embedding_type", ""))),
        **particulars.facts(bridge, hf),  # review 19b: learned sinks, attention biases, rope scaling, experts' act
    )


def _attention_facts(bridge: Any, d_head: int | None, positional: str) -> dict[str, Any]:
    """ModelFacts' rotary_dims and qk_norm from the first block's Hugging Face attention (none read under MLA,
    whose header words name its rotary part, nor where the model has no blocks)."""
    blocks = getattr(bridge, "blocks", None)
    attn = getattr(blocks[0], "attn", None) if blocks is not None and len(blocks) else None
    if d_head is None or attn is None:
        return {}
    raw = raw_module(attn)
    config = getattr(getattr(bridge, "original_model", None), "config", None)
    rotary = attention_layout.rotary_dims(raw, config, d_head) if positional == "rotary" else None
    return {"rotary_dims": rotary, "qk_norm": attention_layout.qk_norm(raw, d_head),
            "clip_qkv": qkv_sites.clip_qkv(raw, config),  # MPT's attn_config.clip_qkv too (review 19a A1)
            "rotary_interleaved": positional == "rotary" and attention_layout.interleaved_rotary(raw, d_head, rotary),
            "norm_placement": config_facts.norm_placement(bridge)}


# HF config fields that bound a model's positions (GPT-2's n_positions, Llama's max_position_embeddings, ...)
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_seq_len",
                  "max_sequence_length")


def config_names_context(config: Any) -> bool:
    """Whether a HF config names a maximum length (its text config's too); True where there is no config
    (headscope cannot tell, so keeps TransformerLens's n_ctx as the limit). BLOOM's names none: ALiBi has
    no position table, and HF runs prompts of any length (review 16c A2)."""
    if config is None:
        return True
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return any(getattr(c, f, None) is not None for c in (config, text) for f in CONTEXT_FIELDS)


def _mlp_width(bridge: Any, configured: int) -> int:
    """d_mlp read from the MLPs' own output weights W_out [d_mlp, d_model] where every block has one and they agree
    (TransformerLens's bridge config gives OPT 4 x d_model whatever its ffn_dim: review 16d A5), else the config's."""
    widths = set()
    for block in getattr(bridge, "blocks", None) or []:
        try:
            w_out = block.mlp.W_out
        except Exception:  # noqa: BLE001 - mixtures of experts and MLPs without one: the config's width
            return configured
        if not isinstance(w_out, torch.Tensor) or w_out.ndim != 2:
            return configured
        widths.add(int(w_out.shape[0]))
    return widths.pop() if len(widths) == 1 else configured


def _projected_embedding(bridge: Any, d_model: int) -> int | None:
    """The token embedding's width where project_in maps it into the stream (OPT-350m: 512 -> 1024), else None."""
    proj = getattr(bridge, "project_in", None)
    weight = getattr(proj, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or int(weight.shape[1]) == d_model:
        return None
    return int(weight.shape[1])


def mla_layout(bridge: Any) -> dict[str, int | None] | None:
    """The multi-head latent attention widths from the HF config (kv_lora_rank set), else None. HF's
    config.head_dim is the rotary part only there (DeepseekV3Config), not a head's width (review 15d A1)."""
    config = getattr(getattr(bridge, "original_model", None), "config", None)
    if getattr(config, "kv_lora_rank", None) is None:
        return None
    nope, rope = int(config.qk_nope_head_dim), int(config.qk_rope_head_dim)
    q_lora = getattr(config, "q_lora_rank", None)
    return {"d_head_qk": nope + rope, "d_head_rope": rope, "d_head_v": int(config.v_head_dim),
            "kv_lora_rank": int(config.kv_lora_rank), "q_lora_rank": int(q_lora) if q_lora else None}


def mla_words(mla: dict[str, Any] | None) -> str:
    """One phrase for headers from ModelFacts.mla: 'multi-head latent attention (q/k heads 20 wide of which 8 rotary, v heads 16,
    K/V from a latent of 32, q from one of 48)', or '' on other attention."""
    m = mla
    if not m:
        return ""
    q = f", q from one of {m['q_lora_rank']}" if m.get("q_lora_rank") else ""
    return (f"multi-head latent attention (q/k heads {m['d_head_qk']} wide of which {m['d_head_rope']} rotary, "
            f"v heads {m['d_head_v']}, K/V from a latent of {m['kv_lora_rank']}{q})")


def _residual_scale(bridge: Any) -> float:
    """The blocks' residual-write scale (the bridge's ScaledResidualBlockBridge: Granite's residual_multiplier)."""
    blocks = list(getattr(bridge, "blocks", None) or [])
    return float(getattr(blocks[0], "residual_contribution_scale", 1.0)) if blocks else 1.0


def _attention_multiplier(bridge: Any, d_head: int | None = None) -> float | None:
    """The attention score scale where it is not 1/sqrt(d_head): the config's (Granite's attention_multiplier);
    on multi-head latent attention (review 16v A1: d_head is v's width there) qk_head_dim^-0.5, times mscale^2
    where a non-default rope sets mscale_all_dim (DeepSeek's YaRN: mscale = 0.1 mscale_all_dim ln(factor) + 1 for
    factor > 1); else the attention modules' own `scaling` where it is not d_head^-0.5 (review 18b A4: Gemma 2/3's
    query_pre_attn_scalar^-0.5); else None."""
    config = getattr(getattr(bridge, "original_model", None), "config", None)
    value = getattr(config, "attention_multiplier", None)
    if isinstance(value, (int, float)):
        return float(value)
    if getattr(config, "kv_lora_rank", None) is None:
        return config_facts.module_score_scale(bridge, d_head) if d_head else None
    scale = float(config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    mscale_all_dim, factor = rope.get("mscale_all_dim") or 0, float(rope.get("factor") or 1.0)
    if rope.get("rope_type", rope.get("type", "default")) != "default" and mscale_all_dim and factor > 1:
        scale *= (0.1 * float(mscale_all_dim) * math.log(factor) + 1.0) ** 2
    return scale


# The hook-free pass behind a plain `model(tokens)` and on-demand attention patterns. It lives in
# headscope.execution.hook_free, which registers it when headscope is imported (models sits below
# execution and cannot import it): fn(model, tokens, attention_mask, *, attention=..., stop_after=...)
# -> logits [batch, pos, d_vocab], or None where it does not apply (the bridge's pass then runs).
_HOOK_FREE_PASS: list[Callable[..., Any]] = []


def register_hook_free_pass(fn: Callable[..., Any]) -> None:
    """Install the hook-free pass (headscope.execution.hook_free does, on import)."""
    _HOOK_FREE_PASS[:] = [fn]


def hook_free_pass(model: HookedModel, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   **kwargs: Any) -> torch.Tensor | None:
    """The registered hook-free pass (see execution.hook_free), or None: none registered, an encoder,
    or hooks attached anywhere in the bridge (then only the bridge's pass fires them)."""
    if not _HOOK_FREE_PASS or model.facts.is_encoder or not model.hook_free():
        return None
    return _HOOK_FREE_PASS[0](model, tokens, attention_mask, **kwargs)


def pad_token_rows(rows: Sequence[Sequence[int]], pad: int, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows of mixed lengths -> ([batch, pos] ids, [batch, pos] attention mask, 1 on real tokens),
    left-padded (decoders: every row ends at the last position, where the answer is read) or
    right-padded (encoders)."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros((len(rows), n), dtype=torch.long)  # [batch, pos]
    for i, r in enumerate(rows):
        sl = slice(n - len(r), n) if left else slice(0, len(r))
        ids[i, sl] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, sl] = 1
    return ids, mask


def first_real_positions(attention_mask: torch.Tensor | None, batch: int) -> torch.Tensor:
    """[batch] int64 on the CPU: each row's first real position (1 in attention_mask [batch, pos]);
    0 without a mask. Under left padding, the row's padding length."""
    if attention_mask is None:
        return torch.zeros(batch, dtype=torch.int64)
    return attention_mask.cpu().bool().int().argmax(1).to(torch.int64)


def left_padding_starts(attention_mask: torch.Tensor | None, batch: int, *, what: str) -> torch.Tensor:
    """first_real_positions, checked: raises PaddingError (`what` says which pass needs it) unless
    every row is a run of padding, then real tokens up to the last position: last-position passes
    read each row's answer there."""
    start = first_real_positions(attention_mask, batch)  # [batch]
    if attention_mask is None:
        return start
    real = attention_mask.cpu().bool()  # [batch, pos]
    if not bool(real[:, -1].all()) or not bool((real.sum(1) == real.shape[1] - start).all()):
        raise PaddingError(f"{what}; a decoder's padded prompts must be left-padded (padding, then the prompt, "
                           f"ending at the last position), as hs.load_task pads them.")
    return start


def pad_id_of(tokenizer: Any) -> int:
    """The id that fills padding: the tokenizer's pad token, else its EOS, else 0 (the mask keeps it
    from ever being attended to, so any id in the vocabulary serves)."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0


def raw_module(module: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face module under a bridge component (its `original_component`, unwrapped as often
    as it is wrapped; the module itself when not wrapped)."""
    while isinstance(getattr(module, "original_component", None), torch.nn.Module):
        module = module.original_component
    return module


def is_parallel(block: torch.nn.Module) -> bool:
    """Attention and MLP read the same block input (TransformerLens's ParallelBlockBridge: GPT-NeoX, GPT-J)."""
    from transformer_lens.model_bridge.generalized_components.block import ParallelBlockBridge

    return isinstance(block, ParallelBlockBridge)


def _bridge_machinery(fn: Any) -> bool:
    """A torch hook the bridge runs for itself: TransformerLens's own (its hook points' wrappers
    too, whose user hooks n_active_hooks counts), transformers' output capturing (installed on the
    first pass), or loading's permanent hooks (the cache-argument route, the rotary dtype cast)."""
    module = getattr(fn, "__module__", None) or ""
    return module.startswith(("transformer_lens.", "transformers.")) or module == "headscope.models.loading"


def _attached(handle: Any) -> bool:
    """A hook point's hook that counts as attached: every temporary one, and every permanent one
    but those the bridge wires for itself (TransformerLens's own functions, e.g. the placeholder
    mirrors on some MLPs). A user's `bridge.add_hook(..., is_permanent=True)` counts."""
    if not handle.is_permanent:
        return True
    fn = getattr(handle, "user_hook", None)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn is None or not (getattr(fn, "__module__", None) or "").startswith("transformer_lens.")


def _hook_tables(module: torch.nn.Module) -> list[dict]:
    """A module's torch hook tables: forward, forward-pre, backward and backward-pre hooks."""
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return [table for table in (getattr(module, name, None) for name in names) if table is not None]


class HookedModel(TLHabits):
    """A hookable transformer: `model(tokens)` gives logits (decoders) or hidden states (encoders).

    TransformerLens's habits (`model("text")`, return_type="loss", run_with_cache, generate, hooks(
    fwd_hooks=...), add_hook, cfg, W_U, ...) come from TLHabits (models/tl_habits.py).

    Attributes: `bridge` (the TransformerBridge), `tokenizer` (HF tokenizer), `facts`
    (ModelFacts), `source` (where the weights came from), `device`. The first CPU model of a
    process sets glibc malloc to keep freed memory (models/heap; HEADSCOPE_KEEP_FREED_MEMORY=0
    turns that off).
    """

    def __init__(self, bridge: Any, tokenizer: Any, facts: ModelFacts, source: str, *,
                 prepend_bos: bool | None = None) -> None:
        self.bridge = bridge
        # the model-wide default of to_tokens(prepend_bos=None): None prepends on decoders (TransformerLens's
        # habit), False runs prompts as the tokenizer tokenizes them, True prepends on encoders too
        self.prepend_bos = prepend_bos
        self.tokenizer = tokenizer
        self.facts = facts
        self.source = source
        self.bridge.eval()
        first = next(self.bridge.parameters(), None)
        if first is not None and first.device.type == "cpu":
            heap.keep_freed_memory()  # sweeps reuse freed activations instead of page-faulting them back
        # every torch hook table of the bridge's modules, scanned by hook_free
        self._hook_tables = [table for module in self.bridge.modules() for table in _hook_tables(module)]

    # ---- basics -------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.bridge.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in: its first floating-point parameter's (a quantized checkpoint's
        integer weights skipped; the bridge's cfg.dtype when it has none), what rounding tolerances and the
        KV cache's bytes are judged in."""
        return next((p.dtype for p in self.bridge.parameters() if p.is_floating_point()), self.bridge.cfg.dtype)

    @property
    def name(self) -> str:
        return self.facts.name

    def _mlp_repr(self) -> str:
        """"d_mlp=192 (relu2 = relu(x)^2, no gate)" for a dense model (the activation where read); else each kind of
        MLP with its layers: "mlp=(layer 0: dense 192; layers 1-2: 6 experts x 64, top-2)" (+ "+ shared 96"),
        from each block's own modules (review 16b C2)."""
        from headscope.models.moe_layout import expert_layout  # it imports this module's raw_module

        kinds: dict[str, list[int]] = {}
        for layer in range(self.facts.n_layers):
            try:
                e = expert_layout(self, layer)
            except Exception:  # noqa: BLE001  a repr never raises: a layout it cannot read is shown as d_mlp
                return f"d_mlp={self.facts.d_mlp}"
            what = (f"dense {self.facts.d_mlp}" if e is None else f"{e.n_experts} experts x {e.expert_width}"
                    + (f", top-{e.top_k}" if e.top_k else "")
                    # review 20a C: which weights mix the chosen experts (Mixtral renormalises; Qwen-MoE may not)
                    + {True: " renormalised", False: " not renormalised"}.get(e.renormalised if e.top_k else None, "")
                    + (f" + shared {e.shared_width}" if e.shared_width else "")
                    + (f", {self.facts.expert_act}" if self.facts.expert_act else ""))  # review 19b A3
            kinds.setdefault(what, []).append(layer)
        if list(kinds) == [f"dense {self.facts.d_mlp}"]:
            kind = config_facts.mlp_words(self.facts.mlp_act, self.facts.gated_mlp)  # review 18e C1
            return f"d_mlp={self.facts.d_mlp}" + (f" ({kind})" if kind else "")

        def named(ls: list[int]) -> str:
            runs = ls == list(range(ls[0], ls[-1] + 1))
            return (f"layer {ls[0]}" if len(ls) == 1 else f"layers {ls[0]}-{ls[-1]}" if runs
                    else "layers " + ",".join(map(str, ls)))
        if len(kinds) == 1:
            return f"mlp=({next(iter(kinds))})"
        return "mlp=(" + "; ".join(f"{named(ls)}: {what}" for what, ls in kinds.items()) + ")"

    def _window_repr(self) -> str:
        """"sliding_window=8 on layers 1,3, " (every layer: "sliding_window=4096, "); '' without sliding layers."""
        found = {i: w for i, w in enumerate(layer_windows(self)) if w is not None}
        if not found:
            return ""
        if len(set(found.values())) > 1:
            return "sliding_window=(" + ", ".join(f"layer {i}: {w}" for i, w in found.items()) + "), "
        where = "" if len(found) == self.facts.n_layers else (
            " on layer" + "s" * (len(found) > 1) + " " + ",".join(map(str, found)))
        return f"sliding_window={next(iter(found.values()))}{where}, "

    def __repr__(self) -> str:
        f = self.facts
        kind = "encoder" if f.is_encoder else "decoder"
        attention = "".join(w + ", " for w in attention_layout.attention_words(f.rotary_dims, f.d_head, f.qk_norm,
                                                                                 f.clip_qkv, f.rotary_interleaved))
        return (
            f"HookedModel({f.name!r}: {f.family} {kind}, {f.n_layers} layers x {f.n_heads} heads "
            f"({f.n_kv_heads} KV), {attention}d_model={f.d_model}, {self._mlp_repr()}, n_ctx={f.context_words}, "
            + self._window_repr()  # review 17d C2: GPT-Neo's local layers, Mistral's, Gemma's sliding layers
            + config_facts.repr_words(f, [i for i, w in enumerate(layer_windows(self)) if w])  # review 18b C1
            + ("norms=LayerNorm1P (weight applied as 1 + w), " if f.norm_one_plus else "")  # review 18e C1
            + particulars.repr_words(f)  # review 19b A2, C3: learned sinks, attention biases, rope scaling
            + f"dtype={str(self.dtype).removeprefix('torch.')}, device={self.device})"
        )

    # ---- tokens -------------------------------------------------------------------------
    def to_tokens(self, text: str | Sequence[str], *, prepend_bos: bool | None = None, warn_unknown: bool = True,
                  padding: bool = False, strict: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Tokenise one string or a list of strings into [batch, pos] int64.

        Decoders get the BOS token prepended when the tokenizer has one and did not add it
        (prepend_bos None: the model's `prepend_bos`, set by load_model; False: as the tokenizer gives them).
        Prompts of different token lengths need `padding=True`, which returns (tokens, attention_mask),
        both [batch, pos], the mask 1 on real tokens: decoders are padded on the left (every row ends at
        the last position; pass the mask to the model, which derives position ids from it), encoders
        on the right. Without it mixed lengths raise a ConfigError (hs.load_task pads a data set with
        answers itself). Words that become the tokenizer's unknown token raise a TokenizationWarning
        naming them (warn_unknown=False: no check; strict=True: a TokenizationError instead).
        """
        texts = [text] if isinstance(text, str) else list(text)
        if not texts:
            raise ConfigError("to_tokens got an empty list of prompts; pass at least one string.")
        rows = [list(self.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts]  # unpadded
        bos = getattr(self.tokenizer, "bos_token_id", None)
        prepend_bos = self.prepends_bos if prepend_bos is None else prepend_bos
        if prepend_bos and bos is not None and not all(r and r[0] == bos for r in rows):
            rows = [[bos, *r] for r in rows] if not padding else [r if r and r[0] == bos else [bos, *r] for r in rows]
        lengths = sorted({len(r) for r in rows})
        if len(lengths) > 1 and not padding:
            raise ConfigError(
                f"to_tokens got prompts of different token lengths ({', '.join(map(str, lengths))}); pass padding=True "
                f"for (tokens, attention_mask) and give the mask to the model, or use hs.load_task for a data set."
            )
        unk = getattr(self.tokenizer, "unk_token_id", None)
        words: list[str] = []
        if (warn_unknown or strict) and unk is not None and any(unk in r for r in rows):
            # the words that fell out (none where the unknown id is only the BOS, as in Qwen's tokenizer)
            words = list(dict.fromkeys(w for t in texts for w in unknown_words(self.tokenizer, t)))
        if words:
            shown = f"{', '.join(map(repr, words[:10]))}{f' and {len(words) - 10} more' if len(words) > 10 else ''}"
            message = (f"{len(words)} word(s) are not in {self.facts.name}'s vocabulary and become "
                       f"{self.tokenizer.unk_token!r}: {shown}")
            if strict:
                raise TokenizationError(f"{message}; strict mode refuses them: rephrase, or use a model whose vocabulary "
                                        f"has them.")
            warnings.warn(f"{message}.", TokenizationWarning, stacklevel=2)
        if not padding:
            return torch.tensor(rows, dtype=torch.long).to(self.device)  # [batch, pos]
        ids, mask = pad_token_rows(rows, self.pad_id, left=not self.facts.is_encoder)
        return ids.to(self.device), mask.to(self.device)

    @property
    def prepends_bos(self) -> bool:
        """Whether to_tokens prepends the BOS by default: the model's `prepend_bos`, or (None) decoders only."""
        return (not self.facts.is_encoder) if self.prepend_bos is None else bool(self.prepend_bos)

    def tokenizer_adds_bos(self) -> bool:
        """Whether the tokenizer itself starts a text with its BOS (Llama's does; GPT-2's does not)."""
        bos = getattr(self.tokenizer, "bos_token_id", None)
        ids = list(self.tokenizer("a", add_special_tokens=True)["input_ids"])
        return bos is not None and ids[:1] == [bos]

    def bos_prefix(self) -> list[int]:
        """The ids a decoder prompt assembled from plain pieces (add_special_tokens=False) starts with,
        as to_tokens would give it: [bos] where to_tokens prepends it or the tokenizer adds it, else []."""
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return [bos] if bos is not None and (self.prepends_bos or self.tokenizer_adds_bos()) else []

    def added_bos(self) -> str | None:
        """The BOS token's text where headscope prepends one that the tokenizer does not add (a decoder
        such as GPT-2 under the default prepend_bos), else None: what the report header says."""
        if self.facts.is_encoder or not self.prepends_bos or self.tokenizer_adds_bos():
            return None
        return getattr(self.tokenizer, "bos_token", None) if getattr(self.tokenizer, "bos_token_id", None) is not None else None

    @property
    def pad_id(self) -> int:
        """The id that fills padding (`pad_id_of` the tokenizer)."""
        return pad_id_of(self.tokenizer)

    def to_str_tokens(self, tokens: torch.Tensor | str | Sequence[str], *, prepend_bos: bool | None = None) -> list:
        """The token strings of one [pos] sequence as people read them (for labels; escape before putting
        in HTML): each token decoded alone (`token_strings`), so byte-level BPE's "ĠMary" reads " Mary",
        as TransformerLens's to_str_tokens. Ids the tokenizer does not know (an embedding padded past
        its vocabulary, as Pythia's 50,304 rows for 50,277 tokens) read "<id N>". Text, as in
        TransformerLens, is tokenized as to_tokens does (BOS prepended on decoders unless
        prepend_bos=False); a list of strings, or a [batch, pos] tensor of several rows, gives one list each."""
        if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, str) for t in tokens):
            return [self.to_str_tokens(t, prepend_bos=prepend_bos) for t in tokens]
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens, prepend_bos=prepend_bos)
        tokens = torch.as_tensor(tokens)
        if tokens.dim() == 2 and tokens.shape[0] > 1:  # [batch, pos]: one list a row, as TransformerLens
            return [token_strings(self.tokenizer, row.tolist()) for row in tokens]
        return token_strings(self.tokenizer, tokens.reshape(-1).tolist())

    def tokens_to_residual_directions(self, tokens: str | int | torch.Tensor) -> torch.Tensor:
        """The unembedding directions W_U[:, tokens], as TransformerLens's: [d_model] for one token
        (an int, a 0-d tensor, or a string that is one token), [*tokens.shape, d_model] for a tensor.

        This model's own W_U: headscope's bridge is unprocessed, so the final norm's weight is not
        folded in here; `Activations.apply_ln_to_stack` (and `logit_attrs`) apply it to the stack
        instead, so `apply_ln_to_stack(stack) @ directions` gives TransformerLens's folded numbers.
        Where the model projects the final stream before its unembedding (OPT-350m's project_out P), the
        direction is P^T W_U[:, tokens], d_model wide, so it dots with the stream the model unembeds.
        Times `facts.logit_scale` where the model scales its logits (Granite's 1 / logits_scaling), so
        the product is the model's own logit: "the vector we dot with to get the logit".
        """
        w_u = unembed_weight(self)  # [d_model, d_vocab]: P^T W_U through OPT's project_out (review 16d A4)
        scale = self.facts.logit_scale  # Granite's 1 / logits_scaling: the direction gives the model's own logit
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)  # one line naming the pieces when it is several
        index = torch.as_tensor(tokens, dtype=torch.long)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= w_u.shape[1]):
            raise IndexOutOfRangeError(f"token ids must lie in [0, {w_u.shape[1]}) for {self.facts.name}; got "
                                       f"min {int(index.min())}, max {int(index.max())}.")
        out = w_u[:, index.to(w_u.device)].movedim(0, -1)  # [*tokens.shape, d_model]
        return out if scale == 1.0 else out * scale

    def check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Validate a [batch, pos] integer token tensor (a [pos] one becomes [1, pos]) and move it to
        the model's device. Float, bool, complex, empty and 3-d inputs are refused: they are almost
        always activations, masks or a batch built wrongly, never token ids."""
        expected = "token ids of shape [batch, pos] (or [pos]) with an integer dtype (torch.long); use model.to_tokens(text)"
        if not isinstance(tokens, torch.Tensor):
            raise InputTypeError(f"tokens must be a torch.Tensor of {expected}; got {type(tokens).__name__}.")
        if tokens.dtype == torch.bool or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
            raise InputTypeError(f"tokens must be {expected}; got dtype {tokens.dtype} with shape {list(tokens.shape)}.")
        if tokens.ndim == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.ndim != 2:
            raise ConfigError(f"tokens must be {expected}; got {tokens.ndim}-d shape {list(tokens.shape)}.")
        if tokens.numel() == 0:
            raise ConfigError(f"tokens must be {expected}; got an empty tensor of shape {list(tokens.shape)}.")
        if self.facts.fixed_context and tokens.shape[1] > self.facts.n_ctx:
            raise ContextLengthError(
                f"The prompt has {tokens.shape[1]} tokens but {self.facts.name} has a context of "
                f"{self.facts.n_ctx}; truncate it (e.g. tokens[:, -{self.facts.n_ctx}:]) or use a "
                f"model with a longer context."
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.facts.d_vocab):
            raise IndexOutOfRangeError(
                f"token ids must lie in [0, {self.facts.d_vocab}) for {self.facts.name}; got "
                f"min {int(tokens.min())}, max {int(tokens.max())}. Tokenise with this model's tokenizer."
            )
        return tokens.to(self.device)

    def check_layer(self, layer: int) -> int:
        if not isinstance(layer, int) or not 0 <= layer < self.facts.n_layers:
            raise IndexOutOfRangeError(
                f"layer {layer!r} is out of range: {self.facts.name} has layers 0..{self.facts.n_layers - 1}."
            )
        return layer

    def check_head(self, layer: int, head: int) -> tuple[int, int]:
        self.check_layer(layer)
        if not isinstance(head, int) or not 0 <= head < self.facts.n_heads:
            raise IndexOutOfRangeError(
                f"head {head!r} is out of range: {self.facts.name} has heads 0..{self.facts.n_heads - 1} per layer."
            )
        return layer, head

    # ---- running ------------------------------------------------------------------------
    def hook_free(self) -> bool:
        """No hook is attached beyond the bridge's own machinery: no hook point's hook (hs.ablate,
        run_with_hooks, a user's permanent `bridge.add_hook`, ...; `n_active_hooks`) and no other
        torch forward or backward hook on any
        of the bridge's modules (resume's pre-hooks on blocks, a user's hook on a Hugging Face
        submodule). The bridge's own torch hooks (TransformerLens and transformers install some on
        the first pass) and loading's permanent hooks (the cache-argument route, the rotary dtype cast) do
        not count. A plain forward may then
        skip the bridge."""
        tables = getattr(self, "_hook_tables", None)  # None: built without __init__ (a test double)
        if tables is None:
            return False
        if any(not _bridge_machinery(fn) for table in tables if table for fn in table.values()):
            return False
        return not self.n_active_hooks()

    def _logits(self, tokens: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, pos, d_vocab] for decoders; final hidden states [batch, pos, d_model] for encoders:
        the pass behind `model(tokens)` (TLHabits.forward adds strings and return types).

        With no hook attached (`hook_free`), a decoder whose hook-free blocks reproduce its pass
        (execution.hook_free: hand-written float32 GPT-2, Llama/Mistral/Qwen2 and GPT-NeoX blocks,
        else the model's own Hugging Face layers in any dtype, checked once per model by
        resume.supports) runs them, with the fused attention kernel: no per-layer
        [batch, head, q, k] pattern is materialised, and no per-module hook machinery runs. Any
        attached hook sends the pass through the bridge, where every hook fires.
        """
        tokens = self.check_tokens(tokens)
        if not self.facts.is_encoder:
            logits = hook_free_pass(self, tokens, attention_mask)
            if logits is not None:
                return logits
        return self.bridge_forward(tokens, attention_mask=attention_mask)

    def bridge_forward(self, tokens: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """forward through the TransformerBridge, hooks attached or not (every hook point fires)."""
        tokens = self.check_tokens(tokens)
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(self.device)
        if not self.facts.is_encoder:
            return self.bridge(tokens, return_type="logits", **kwargs)
        # Stop after the last block: the bridge's (random) MLM head would cost as much as the
        # encoder and [batch, pos, d_vocab] floats; the bridge returns the stopping activation.
        from transformer_lens.model_bridge.exceptions import StopAtLayerException

        def stop(act: torch.Tensor, hook: Any) -> None:
            raise StopAtLayerException(act)

        with self.hooks(fwd=[(f"blocks.{self.facts.n_layers - 1}.hook_resid_post", stop)]):
            return self.bridge(tokens, return_type="logits", **kwargs)

    def n_active_hooks(self) -> int:
        """How many hook functions are attached to hook points right now (0 between analyses),
        permanent ones a user added (`bridge.add_hook(..., is_permanent=True)`) included: every
        fast path checks this (through `hook_free`), so no attached hook is ever skipped. Permanent
        hooks the bridge installs for itself (TransformerLens's own functions) are not counted.
        """
        points = {id(hp): hp for hp in self.bridge.hook_points()}  # an aliased point is listed under each name
        return sum(_attached(handle) for hp in points.values() for handle in (*hp.fwd_hooks, *hp.bwd_hooks))


def layer_windows(model: Any) -> tuple[int | None, ...]:
    """Per layer, its sliding attention window (the keys a query sees: the last `window`), or None for
    a global layer, read from the Hugging Face config as the model's own mask reads it: GPT-Neo's
    config.attention_layers ("local" layers see config.window_size keys, modeling_gpt_neo's
    bitwise_xor mask); else config.layer_types where given (Gemma 2/3, Cohere 2, Qwen2 with
    use_sliding_window, whose config builds layer_types from max_window_layers), else every layer
    slides when config.sliding_window is set (Mistral, Phi-3, StarCoder2). What the KV cache keeps is
    cache_windows: GPT-Neo's keeps every position."""
    n = model.facts.n_layers
    config = getattr(getattr(model.bridge, "original_model", None), "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    if model.facts.is_encoder or config is None:
        return (None,) * n
    kinds, window = getattr(config, "attention_layers", None), getattr(config, "window_size", None)
    if isinstance(kinds, (list, tuple)) and isinstance(window, int) and window >= 1:  # GPT-Neo
        return tuple(window if i < len(kinds) and kinds[i] == "local" else None for i in range(n))
    return cache_windows(model)


def cache_windows(model: Any) -> tuple[int | None, ...]:
    """Per layer, the window Hugging Face's KV cache keeps (its last window - 1 positions), or None where it keeps
    every position: transformers' DynamicCache reads config.sliding_window and config.layer_types only
    (cache_utils), so it equals layer_windows except on GPT-Neo, whose local layers' cache keeps every position
    though their attention sees only window_size keys (review 17d C3)."""
    n = model.facts.n_layers
    config = getattr(getattr(model.bridge, "original_model", None), "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    if model.facts.is_encoder or config is None:
        return (None,) * n
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window < 1:
        return (None,) * n
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * n
    return tuple(window if i < len(types) and types[i] == "sliding_attention" else None for i in range(n))


def and_join(words: list[str]) -> str:
    """'a', 'a and b', 'a, b and c': a list in a finding's words (reports.findings re-exports it)."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def window_words(windows: Mapping[int, int] | Sequence[int | None], n_layers: Any = None, *, short: bool = False) -> str:
    """The sliding windows in words, the one description of them; '' without one. windows: layer_windows' tuple, or
    {layer: window} of the windowed layers only (the manifest's attention_windows, a summary's) with n_layers.
    The header and the repr: "layers 1, 3 attend over a sliding window of 8 keys (the others globally)", "every
    layer attends over ..."; short, in a finding's parenthesis, by layer: "every layer over 6 keys", "layers 0 and 2
    over 8 keys and layer 1 over 4 keys" ("every layer" where one window covers n_layers layers)."""
    found = ({int(k): int(v) for k, v in windows.items()} if isinstance(windows, Mapping)
             else {i: int(w) for i, w in enumerate(windows) if w is not None})
    if not found:
        return ""
    n = n_layers if n_layers is not None else (None if isinstance(windows, Mapping) else len(windows))
    if short:
        by_window: dict[int, list[int]] = {}
        for layer, w in sorted(found.items()):
            by_window.setdefault(w, []).append(layer)
        return and_join([("every layer" if len(ls) == n else ("layer " if len(ls) == 1 else "layers ")
                          + and_join([str(l) for l in ls])) + f" over {w} keys" for w, ls in by_window.items()])
    sizes = sorted(set(found.values()))
    size = f"{sizes[0]} keys" if len(sizes) == 1 else "; ".join(
        f"{w} keys on layer(s) {', '.join(str(k) for k, v in found.items() if v == w)}" for w in sizes)
    if n is not None and len(found) == n:
        return f"every layer attends over a sliding window of {size}"
    who = f"layer {next(iter(found))}" if len(found) == 1 else "layers " + ", ".join(map(str, found))
    return f"{who} attend{'s' if len(found) == 1 else ''} over a sliding window of {size} (the others globally)"


def visible_keys(queries: Any, keys: Any, window: int | None) -> torch.Tensor:
    """bool, queries and keys broadcast: does query position q see key position k on a decoder layer
    with sliding window `window` (layer_windows; None: a global layer)? Causal, k <= q, and on a sliding
    layer k > q - window: the query itself and the window - 1 keys before it (transformers'
    sliding_window_overlay, shared by Mistral, Qwen2, Gemma 2 and Gemma 3's causal layers). Positions
    are indices into the padded row, left padding included, as Hugging Face's mask counts them; the
    padding mask applies on top. queries, keys: ints or integer tensors."""
    q, k = torch.as_tensor(queries), torch.as_tensor(keys)
    seen = k <= q
    return seen if window is None else seen & (k > q - window)
