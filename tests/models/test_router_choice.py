"""Review 20e A1/A2: routers that choose on another score than their logits (Ernie 4.5-MoE: softmax + a correction
bias; Glm4-MoE: sigmoid + a correction bias within the groups it keeps), in bfloat16. Their weights stay float32 as
Hugging Face's own bfloat16 load keeps them (its _keep_in_fp32_modules_strict), so headscope's router logits are
Hugging Face's; and the scores the margins rank choose the experts Hugging Face's router module chose. Tiny random
checkpoints (2 layers, 8 experts, top-2), correction biases drawn N(0, 0.2^2) so that they reorder the experts."""
import warnings

import pytest
import torch

import headscope as hs
from headscope.models.moe_layout import choice_scores
from tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer

TOKENS = torch.tensor([[2] + list(range(10, 26)), [2] + list(range(30, 46))])  # [2, 17]


def _ernie():
    from transformers import Ernie4_5_MoeConfig

    return Ernie4_5_MoeConfig(vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, intermediate_size=32,
                              moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              moe_k=2, moe_num_experts=8, moe_num_shared_experts=1, moe_layer_start_index=0,
                              max_position_embeddings=64, bos_token_id=2, eos_token_id=3, pad_token_id=1)


def _glm4_moe():
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, intermediate_size=32,
                         moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, num_experts_per_tok=2, n_routed_experts=8, n_shared_experts=1, n_group=4,
                         topk_group=2, first_k_dense_replace=0, max_position_embeddings=64, bos_token_id=2,
                         eos_token_id=3, pad_token_id=1)


def _init(model):
    for name, p in model.named_parameters():
        if "correction_bias" in name:
            p.normal_(0, 0.2)
        elif p.ndim >= 2:
            p.normal_(0, 0.2)
    for name, b in model.named_buffers():
        if "correction_bias" in name:
            b.normal_(0, 0.2)


@pytest.fixture(scope="module", params=["ernie", "glm4_moe"])
def router_models(request, tmp_path_factory):
    """(hf, model): Hugging Face's own bfloat16 load and headscope's of one checkpoint saved in float32."""
    folder = tmp_path_factory.mktemp(request.param)
    save_random_checkpoint(_ernie() if request.param == "ernie" else _glm4_moe(), folder, word_tokenizer(), init=_init)
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
        model = hs.load_model(folder, device="cpu", dtype="bfloat16")
    return hf, model


def _hf_router_calls(hf, layer):
    """Hugging Face's router module of `layer` on its own forward of TOKENS: (its input [N, d_model], its logits
    [N, expert], the experts it chose [N, top_k])."""
    seen = {}
    gate = hf.model.layers[layer].mlp.gate
    handle = gate.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    try:
        with torch.no_grad():
            hf(TOKENS)
    finally:
        handle.remove()
    out = seen["out"]
    if isinstance(out, tuple):  # (logits, weights, indices); transformers 5.9's Ernie: (logits, indices, weights)
        logits, chosen = out[0], next(t for t in out[1:] if not t.is_floating_point())
    else:  # transformers 5.9's Glm4-MoE: the router gives logits, its block chooses
        logits, chosen = out, hf.model.layers[layer].mlp.route_tokens_to_experts(out)[0]
    return seen["x"].reshape(-1, seen["x"].shape[-1]), logits, chosen


def test_router_weights_stay_float32_and_logits_are_hugging_faces(router_models):
    """A2: the router weight is float32 in both (HF's strict keep-in-float32 plan) and equal; the router logits
    headscope captures are those HF's router module gives on the same MLP input (before the fix the weight was
    rounded to bfloat16 and they differed by about 0.1). Transformers 5.9 keeps only Glm4-MoE's correction bias in
    float32, not its router weight: headscope then holds what that version's own load holds."""
    from headscope.models.moe_layout import moe_parts

    hf, model = router_models
    own, theirs = moe_parts(model.bridge.blocks[1].mlp)[0].weight, hf.model.layers[1].mlp.gate.weight
    assert own.dtype == theirs.dtype and torch.equal(own, theirs)  # float32 where HF keeps it (transformers >= 5.1x)
    if hasattr(type(hf), "_keep_in_fp32_modules_strict") and "gate.weight" in (hf._keep_in_fp32_modules_strict or ()):
        assert own.dtype == torch.float32
    names = [hs.site("router_logits", 1), hs.site("mlp_pre", 1)]
    acts = hs.capture(model, TOKENS, names)
    x = acts[names[1]]  # [2, 17, d_model] the MoE block's input
    assert x.shape[-1] == 32 and x.dtype == torch.bfloat16
    with torch.no_grad():
        out = hf.model.layers[1].mlp.gate(x.reshape(-1, 32))  # HF's router on that input (5.9's Glm4-MoE: logits)
        want = out[0] if isinstance(out, tuple) else out  # [N, expert]
    torch.testing.assert_close(acts[names[0]].reshape(want.shape).float(), want.float(), rtol=0, atol=1e-6)


def test_choice_scores_rank_the_experts_hugging_faces_router_chose(router_models):
    """A1: the top-2 of choice_scores are the experts HF's router module chose, on every token; the raw logits'
    top-2 are not (the correction bias reorders them on these weights), so ranking logits names the wrong pair."""
    hf, model = router_models
    x, logits, chosen = _hf_router_calls(hf, 0)
    scores, words, computed = choice_scores(model, 0, logits)
    ours = scores.topk(2, dim=-1).indices.sort(-1).values
    assert torch.equal(ours, chosen.sort(-1).values)
    assert not torch.equal(logits.topk(2, dim=-1).indices.sort(-1).values, chosen.sort(-1).values)
    assert "correction bias" in words and computed == torch.float32


def test_layout_words_name_the_routers_choice_score(router_models):
    """Review 20e B (redone): the header's layout words say Ernie 4.5-MoE chooses on its softmax plus the correction
    bias (HF's Ernie4_5_MoeStatics) and renormalises the chosen weights (HF divides them by their sum), and Glm4-MoE
    on the sigmoid plus its bias within the best groups, as each HF router computes."""
    from headscope.reports.moe_words import renormalised_words

    hf, model = router_models
    layout = hs.hooks.expert_layout(model, 0).as_dict()
    words = renormalised_words(layout)
    assert layout["choice_bias"] is True and layout["renormalised"] is True
    if hasattr(hf.model.layers[0].mlp.gate, "moe_statics"):
        assert layout["scoring"] == "softmax"
        assert words == (" by softmax probability plus e_score_correction_bias (for the choice only); weights: the "
                         "chosen experts' probabilities renormalised to sum to 1")
    else:
        assert layout["scoring"] == "sigmoid" and "within the best 2 of 4 expert groups" in words
