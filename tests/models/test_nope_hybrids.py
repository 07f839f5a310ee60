"""Review 20c A1 (redone): Cohere 2 and EXAONE 4 apply their rotary embedding only on their sliding-window layers; the
global layers see positions only through the causal mask (NoPE). Tiny random checkpoints (2 layers: 0 sliding, 1
global); which layers rotate is read off Hugging Face's own attention modules by what they compute: each layer's
attention output on the same hidden states with positions 0..5 and with positions 0, 2, ..., 10 (a shift alone
would not tell, rotary scores depending on relative positions only)."""
import warnings

import pytest
import torch

import headscope as hs
from tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer


def _config(family: str):
    common = dict(vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention"], bos_token_id=2, eos_token_id=3, pad_token_id=1)
    if family == "cohere2":
        from transformers import Cohere2Config

        return Cohere2Config(**common)
    from transformers import Exaone4Config

    return Exaone4Config(**common)


@pytest.fixture(scope="module", params=["cohere2", "exaone4"])
def hybrid(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_random_checkpoint(_config(request.param), folder, word_tokenizer())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.eval(), hs.load_model(folder, device="cpu", dtype="float32")


def _moves_with_positions(hf, layer: int) -> bool:
    """Whether HF's attention of `layer` gives another output when the positions are spread out."""
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(0))
    outs = []
    for pos in (torch.arange(6)[None], 2 * torch.arange(6)[None]):
        with torch.no_grad():
            emb = hf.model.rotary_emb(x, pos)
            outs.append(hf.model.layers[layer].self_attn(hidden_states=x, position_embeddings=emb,
                                                         attention_mask=None)[0])
    return not torch.allclose(outs[0], outs[1], atol=1e-6)


def test_global_layers_named_nope_as_hugging_face_computes_them(hybrid):
    hf, model = hybrid
    rotary = [_moves_with_positions(hf, layer) for layer in range(2)]
    assert rotary == [True, False]  # the checkpoint is the hybrid the review saw
    assert model.facts.nope_layers == tuple(i for i, r in enumerate(rotary) if not r)
    assert model.facts.rope_bases is not None and model.facts.rope_bases[1] is None
    assert model.facts.rope_bases[0] is not None
    assert "no rotary (NoPE) on layer 1" in repr(model)


def test_q_sites_say_where_the_per_head_norm_runs(hybrid):
    """Review 20c (redone): hook_q holds the projection's output per head (HF's q_proj), before EXAONE 4's per-head
    q_norm; on the NoPE layer rot_q holds what attention uses unrotated, HF's q_norm(q_proj(x)) (Cohere 2, without a
    q/k norm: q itself). The site table says which."""
    from headscope.hooks.sites import describe_site

    hf, model = hybrid
    tokens = torch.tensor([[2, 10, 11, 12, 13, 14]])
    attn = hf.model.layers[1].self_attn
    seen = {}
    hooks = [attn.q_proj.register_forward_hook(lambda m, a, o: seen.update(q=o))]
    if hasattr(attn, "q_norm"):
        hooks.append(attn.q_norm.register_forward_hook(lambda m, a, o: seen.update(qn=o)))
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        for h in hooks:
            h.remove()
    q = seen["q"].reshape(1, 6, 4, 8)  # [batch, pos, head, d_head]
    normed = seen["qn"].transpose(1, 2) if "qn" in seen else q  # HF norms [batch, head, pos, d_head]
    names = [hs.site("q", 1), hs.site("rot_q", 1)]
    acts = hs.capture(model, tokens, names)
    torch.testing.assert_close(acts[names[0]], q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acts[names[1]], normed, atol=1e-5, rtol=1e-5)
    q_doc = describe_site("q", facts=model.facts, layer=1)[1]
    rot_doc = describe_site("rot_q", facts=model.facts, layer=1)[1]
    if hasattr(attn, "q_norm"):
        assert not torch.allclose(q, normed, atol=1e-3)  # the norm moves q, so the words matter
        assert "before the q/k RMSNorm per head, which attention applies next" in q_doc
        assert "equal to q after the q/k RMSNorm per head: no rotary (NoPE) on this layer" in rot_doc
    else:
        assert "before the q/k" not in q_doc and "equal to q: no rotary (NoPE) on this layer" in rot_doc
