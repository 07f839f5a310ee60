"""The encoder metric of a bfloat16 run (review 11a A1, A2): a random BERT in bfloat16 against plain Hugging Face in
bfloat16 with the pooling and the cosine done by hand in float32. A cosine taken in bfloat16 has steps of 2^-8
near 1: the unpruned model's cosine with itself read 0.99902, every head's and token's change a multiple of
that step (leave-one-out all 0 on some examples); the bfloat16 model's own hidden states resolve them."""
from __future__ import annotations

import contextlib

import pytest
import torch

import headscope as hs
from headscope.analyses.attribution import methods as am
from tests_support import MIXED_FIELDS, hf_reference, hf_z_edit, mixed_length_rows


@pytest.fixture(scope="module")
def bf16_bert(arch_dirs):
    """(headscope's bfloat16 BERT, plain HF's bfloat16 BertModel, a right-padded Task of 6 prompts of 8-25 tokens)."""
    model = hs.load_model(arch_dirs["bert"], device="cpu", dtype=torch.bfloat16)
    hf = hf_reference(arch_dirs["bert"]).to(torch.bfloat16)
    fields = {k: v for k, v in MIXED_FIELDS.items() if k != "corrupted_prompt"}
    return model, hf, hs.load_task(model, mixed_length_rows(model, 6, corrupt=False), fields)


def _hf_pooled(hf, tokens: torch.Tensor, mask: torch.Tensor | None = None, edit=None) -> torch.Tensor:
    """[batch, d]: the mean over real tokens of HF's bfloat16 last hidden state, taken in float32."""
    with torch.no_grad(), hf_z_edit(hf, edit) if edit else contextlib.nullcontext():
        hidden = hf(tokens, attention_mask=mask).last_hidden_state.float()  # [batch, pos, d]
    m = torch.ones(hidden.shape[:2]) if mask is None else mask.float()
    return (hidden * m[..., None]).sum(1) / m.sum(1, keepdim=True)


def test_bfloat16_head_ablation_is_the_float32_cosine_of_the_models_states(bf16_bert):
    """Unpruned, the metric is each embedding's cosine with itself, 1 (bfloat16: 0.99902 before); each head's
    zero-ablation drop equals 1 - the mean hand cosine to float32 precision (bfloat16: a multiple of 2^-8 / 6)."""
    model, hf, task = bf16_bert
    res = hs.head_importance(model, task, methods=("zero",))
    assert res.summary["baseline_metric"] == pytest.approx(1.0, abs=1e-6)
    ref = _hf_pooled(hf, task.tokens, task.attention_mask)  # [6, d]
    got = res.df[res.df.method == "zero"].set_index(["layer", "head"]).importance
    for layer in range(model.facts.n_layers):
        for head in range(model.facts.n_heads):
            def zero(lyr, z, layer=layer, head=head):
                return z if lyr != layer else z.index_fill(2, torch.tensor([head]), 0.0)

            cos = torch.nn.functional.cosine_similarity(_hf_pooled(hf, task.tokens, task.attention_mask, zero), ref, dim=-1)
            hand = float(1 - cos.double().mean())
            assert abs(float(got[layer, head]) - hand) < 1e-6 and hand > 1e-3


def test_bfloat16_leave_one_out_and_ig_endpoint_are_float32_cosines(bf16_bert):
    """Leave-one-out's 1 - cosine per token equals HF's by hand (pooled and compared in float32), one value for each
    distinct sequence left; the metric IG integrates reads 1 at the prompt's own embedding (its endpoint, bfloat16: 0.996
    or 0.992)."""
    model, hf, task = bf16_bert
    tokens = task.example(1).tokens  # [1, 14]: [CLS] ... [SEP], no padding
    positions = list(range(1, tokens.shape[1] - 1))
    got = am.leave_one_out(model, tokens, positions)[0]  # [12]
    base = _hf_pooled(hf, tokens)[0]  # [d]
    hand = torch.stack([1 - torch.nn.functional.cosine_similarity(
        _hf_pooled(hf, torch.cat([tokens[:, :p], tokens[:, p + 1:]], 1))[0], base, dim=0) for p in positions])
    # Deleting either of two equal neighbours leaves the same sequence, so the same value: count the distinct sequences.
    n_sequences = len({tuple(torch.cat([tokens[0, :p], tokens[0, p + 1:]]).tolist()) for p in positions})
    assert torch.allclose(got.float(), hand, rtol=1e-5, atol=1e-7) and len(set(got.tolist())) == n_sequences
    with torch.no_grad():
        own = am.forward_metric(model, "cosine")(tokens, base[None])  # [1]
    assert float(own[0]) == pytest.approx(1.0, abs=1e-6)
