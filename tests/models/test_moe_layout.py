"""models/moe_layout.py: a mixture of experts' layout read from the model's own modules, below hooks."""
import transformers

import headscope as hs
from headscope.models import hooked_model
from headscope.models.moe_layout import expert_layout


def test_the_layout_reader_lives_in_models_and_reads_each_block_as_the_hf_config_says(mixed_moe_dir):
    """Mend 1: HookedModel's repr named each kind of MLP through a global that hooks/memories.py set on import (models
    may not import hooks), so without hooks it printed d_mlp on a mixture of experts. The reader now lives in models/,
    which the repr calls. Hand-read from the HF config: layer 0 (mlp_only_layers) is dense; layer 1 has num_experts
    experts of moe_intermediate_size, top num_experts_per_tok, and a gated shared expert of
    shared_expert_intermediate_size, its top-k weights renormalised as norm_topk_prob says."""
    c = transformers.AutoConfig.from_pretrained(mixed_moe_dir)
    model = hs.load_model(mixed_moe_dir, device="cpu")
    assert c.mlp_only_layers == [0] and c.num_hidden_layers == 2
    assert expert_layout(model, 0) is None
    e = expert_layout(model, 1)
    assert (e.n_experts, e.expert_width, e.top_k, e.shared_width, e.shared_gated, e.renormalised) == (
        c.num_experts, c.moe_intermediate_size, c.num_experts_per_tok, c.shared_expert_intermediate_size, True,
        c.norm_topk_prob)
    assert hs.hooks.expert_layout is expert_layout and not hasattr(hooked_model, "EXPERT_LAYOUT")
    assert (f"mlp=(layer 0: dense {c.intermediate_size}; layer 1: {c.num_experts} experts x "
            f"{c.moe_intermediate_size}, top-{c.num_experts_per_tok}{'' if c.norm_topk_prob else ' not'} renormalised"
            f" + shared {c.shared_expert_intermediate_size})"
            ) in repr(model)
