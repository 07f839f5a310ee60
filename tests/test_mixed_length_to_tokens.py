"""model.to_tokens(texts, padding=True) for prompts of mixed token lengths: (tokens, attention_mask) that
are the plain Hugging Face tokenizer's ids of each text (BOS as to_tokens adds it alone), padded with
the model's pad id on the left (decoders) or right (encoders); given to the model with its mask, each
row's outputs equal plain Hugging Face on that text alone. Without padding=True mixed lengths are one
ConfigError pointing to padding=True and hs.load_task."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from tests_support import hf_reference

TEXTS = ["The cat sat.", "A dog ran in the park today.", "Birds sing in the early morning light of spring."]


@pytest.mark.parametrize("arch", ["gpt2", "llama3", "neox", "bert"])
def test_padded_to_tokens_gives_each_row_its_own_outputs(arch, arch_models, arch_dirs):
    from transformers import AutoTokenizer

    model = arch_models(arch)
    tok = AutoTokenizer.from_pretrained(arch_dirs[arch])
    encoder = model.facts.is_encoder
    rows = [tok(t)["input_ids"] for t in TEXTS]
    bos = tok.bos_token_id
    if not encoder and bos is not None:
        rows = [r if r[0] == bos else [bos, *r] for r in rows]
    assert len({len(r) for r in rows}) == len(rows)  # three different lengths
    n = max(map(len, rows))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tokens, mask = model.to_tokens(TEXTS, padding=True)
    for i, r in enumerate(rows):
        padding = [pad] * (n - len(r))
        assert tokens[i].tolist() == (r + padding if encoder else padding + r)
        assert mask[i].tolist() == ([1] * len(r) + [0] * len(padding) if encoder else [0] * len(padding) + [1] * len(r))
    with pytest.raises(hs.ConfigError, match=r"different token lengths.*padding=True.*hs\.load_task"):
        model.to_tokens(TEXTS)
    hf = hf_reference(arch_dirs[arch])
    with torch.no_grad():
        out = model(tokens, attention_mask=mask)  # [batch, pos, d_vocab] (decoders) or [batch, pos, d_model]
        worst = 0.0
        for i, r in enumerate(rows):
            alone = torch.tensor([r])
            ref = hf(alone).last_hidden_state[0] if encoder else hf(alone).logits[0]  # [pos, d]
            mine = out[i, :len(r)] if encoder else out[i, n - len(r):]
            worst = max(worst, float((mine - ref).abs().max() / ref.abs().max()))
    assert worst <= 1e-4, worst


def test_a_bos_that_is_also_the_unknown_token_is_no_unknown_word(arch_models):
    """Qwen-style tokenizers name one id as BOS and unknown: prepending it must not warn of "0 word(s)"."""
    import warnings

    from headscope.errors import TokenizationWarning

    model = arch_models("qwen2")
    assert model.tokenizer.unk_token_id == model.tokenizer.bos_token_id
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenizationWarning)
        tokens, _ = model.to_tokens(["the cat sat", "a dog ran on the grass"], padding=True, strict=True)
    assert int(tokens[1, 0]) == model.tokenizer.bos_token_id
