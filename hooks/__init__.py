"""Hooks: site names, capture, MLP memories, KV states and interventions (removed on exit)."""
from headscope.hooks.attention import expand_kv_heads, scaled_dot_product
from headscope.hooks.cache import Activations, head_result
from headscope.hooks.capture import capture, run_with_cache
from headscope.hooks.interventions import ablate, head_gates, patch
from headscope.hooks.kv_states import GenerationTrace, KVStates, generate_with_kv, kv_states
from headscope.hooks.memories import (
    MLPMemories,
    is_moe,
    memories_gap,
    mlp_memories,
    moe_coefficients,
    moe_layers,
    n_memories,
)
from headscope.hooks.patterns import attention_pattern, reduce_patterns
from headscope.hooks.sites import SITES, available_sites, check_site, parse_site, site
from headscope.models.moe_layout import ExpertLayout, expert_layout

__all__ = [
    "SITES",
    "Activations",
    "ExpertLayout",
    "GenerationTrace",
    "KVStates",
    "MLPMemories",
    "ablate",
    "attention_pattern",
    "reduce_patterns",
    "available_sites",
    "capture",
    "check_site",
    "expand_kv_heads",
    "expert_layout",
    "generate_with_kv",
    "head_gates",
    "head_result",
    "is_moe",
    "memories_gap",
    "moe_layers",
    "kv_states",
    "mlp_memories",
    "moe_coefficients",
    "n_memories",
    "parse_site",
    "patch",
    "run_with_cache",
    "scaled_dot_product",
    "site",
]
