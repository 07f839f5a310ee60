"""Review 20 A1: Cohere2 and Exaone4 (hybrid sliding/global attention) apply rotary only on their sliding layers; their
global layers are NoPE. facts.nope_layers names them, rope_bases has None there, and print(model), the report header
and model.cfg say so. Checked against the Hugging Face attention modules themselves: on a NoPE layer the module's
output does not move when the position ids change the query-key distances, on a rotary layer it does."""
from __future__ import annotations

import pytest
import torch
import transformers

import headscope as hs
from headscope.models.config_facts import header_words
from headscope.reports.report import model_record

ARCHS = ("cohere2", "exaone4")


@pytest.fixture(scope="module")
def hybrids(more_arch_dirs):
    """arch -> (HookedModel, HF eager model) of the tiny random Cohere2 and Exaone4 (layer 0 sliding, 1 global)."""
    out = {}
    for arch in ARCHS:
        folder = more_arch_dirs(arch)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        out[arch] = hs.load_model(folder, device="cpu"), hf
    return out


def hf_position_blind(hf, layer: int) -> bool:
    """Whether HF's own attention module at `layer` gives the same output for position ids 0..7 and 0, 3, .., 21 (the
    query-key distances tripled; a constant shift would leave rotary's scores as they are too)."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, hf.config.hidden_size)  # [batch, pos, d_model]
    attn = hf.model.layers[layer].self_attn
    outs = []
    with torch.no_grad():
        for pos in (torch.arange(8)[None], 3 * torch.arange(8)[None]):  # [1, pos]
            out = attn(hidden_states=x, position_embeddings=hf.model.rotary_emb(x, pos), attention_mask=None)[0]
            outs.append(out)  # [batch, pos, d_model]
    return torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("arch", ARCHS)
def test_global_layers_without_rotary_are_named_nope(hybrids, arch):
    model, hf = hybrids[arch]
    blind = tuple(layer for layer in range(2) if hf_position_blind(hf, layer))
    assert blind == (1,)  # HF's global layer ignores positions, its sliding one does not
    assert model.facts.nope_layers == blind
    base = float(hf.config.rope_parameters["rope_theta"])
    assert model.facts.rope_bases == (base, None)
    assert "no rotary (NoPE) on layer 1, " in repr(model)
    assert "no rotary (NoPE) on layer 1" in header_words(model_record(model))
    assert list(model.cfg.nope_layers) == [1]
