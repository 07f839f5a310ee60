"""models.key_norm: the range of key norms a key norm allows, against the Hugging Face norm modules themselves."""
from __future__ import annotations

import math

import pytest
import torch

from headscope.models.key_norm import norm_range


def _modules():
    """Qwen3's per-head RMSNorm (weight w), Gemma 3's (1 + w), OLMo 2's over both KV heads (32 entries) and a
    LayerNorm with a bias, each with random weights; with the effective per-entry gain and bias by hand."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    g = torch.Generator().manual_seed(0)
    qwen, gemma, olmo, layer = Qwen3RMSNorm(16), Gemma3RMSNorm(16), Olmo2RMSNorm(32), torch.nn.LayerNorm(16)
    with torch.no_grad():
        qwen.weight.copy_(torch.rand(16, generator=g) + 0.5)  # 0.5-1.5
        gemma.weight.copy_(torch.rand(16, generator=g) - 0.5)  # scales by 1 + w: 0.5-1.5
        olmo.weight.copy_(torch.rand(32, generator=g) * 2 - 0.5)  # -0.5-1.5: |w| counts
        layer.weight.copy_(torch.rand(16, generator=g) + 0.5)
        layer.bias.copy_(torch.rand(16, generator=g) * 0.1)
    cases = [(qwen, qwen.weight, None, True), (gemma, 1 + gemma.weight, None, True), (olmo, olmo.weight, None, False),
             (layer, layer.weight, layer.bias, True)]
    return [(m, gain.detach(), None if bias is None else bias.detach(), per_head) for m, gain, bias, per_head in cases]


@pytest.mark.parametrize("index", range(4))
def test_norm_range_is_sqrt_dim_times_the_weights_range_and_the_norms_outputs_reach_it(index):
    module, gain, bias, per_head = _modules()[index]
    dim = gain.numel()
    got = norm_range(module, "k_norm", d_head=16)
    shift = 0.0 if bias is None else float(bias.norm())
    lo, hi = math.sqrt(dim) * float(gain.abs().min()), math.sqrt(dim) * float(gain.abs().max())
    assert got.per_head is per_head and got.dim == dim and got.module == "k_norm"
    assert got.gain == pytest.approx((float(gain.abs().min()), float(gain.abs().max())), rel=1e-5)
    assert got.bounds == pytest.approx((lo - shift, hi + shift), rel=1e-5)
    with torch.no_grad():  # the module's own outputs: random keys stay inside; RMS norms reach both ends
        norms = module(torch.randn(2000, dim, generator=torch.Generator().manual_seed(1)) * 5).norm(dim=-1)
        assert got.bounds[0] - 1e-4 <= float(norms.min()) and float(norms.max()) <= got.bounds[1] + 1e-4
        if bias is None:
            ends = module(torch.eye(dim)[[int(gain.abs().argmin()), int(gain.abs().argmax())]]).norm(dim=-1)
            assert ends.tolist() == pytest.approx([lo, hi], rel=1e-4)


def test_norm_range_reads_a_per_head_weight_of_shape_heads_by_d_head():
    """Review 16a A2: Cohere's k_norm is one LayerNorm with a [n_kv_heads, d_head] weight (each KV head's d_head
    entries normalised, scaled by that head's row); probed with a [1, d_head] input it broadcast to [2, 16] and
    norm_range gave up (None), so kv reported a first-key ratio that the weight fixes. By hand: every head's output
    over d_head = 16 entries has norm 4 x |w| over that row, so the bounds are 4 x min |w| and 4 x max |w| over
    both rows; the module's own outputs on random keys stay inside them."""
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    g = torch.Generator().manual_seed(3)
    module = CohereLayerNorm(hidden_size=(2, 16))
    with torch.no_grad():
        module.weight.copy_(torch.rand(2, 16, generator=g) * 2 - 0.5)  # -0.5-1.5: |w| counts
    w = module.weight.detach().abs()
    got = norm_range(module, "k_norm", d_head=16)
    assert got is not None and got.per_head is True and got.dim == 16 and got.kind == "CohereLayerNorm"
    assert not got.rms  # a LayerNorm: the finding says "normalised", not "RMS-normalised"
    assert got.gain == pytest.approx((float(w.min()), float(w.max())), rel=1e-5)
    assert got.bounds == pytest.approx((4 * float(w.min()), 4 * float(w.max())), rel=1e-5)
    with torch.no_grad():
        norms = module(torch.randn(2000, 2, 16, generator=torch.Generator().manual_seed(1)) * 5).norm(dim=-1)
        assert got.bounds[0] - 1e-4 <= float(norms.min()) and float(norms.max()) <= got.bounds[1] + 1e-4
    ones = CohereLayerNorm(hidden_size=(2, 16))  # untrained (weights 1): every key's norm is sqrt(16) = 4
    assert norm_range(ones, "k_norm", d_head=16).bounds == pytest.approx((4.0, 4.0), rel=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_norm_range_reads_a_module_list_of_per_head_layernorms(bias):
    """Review 17a A1: StableLM's k_layernorm (qk_layernorm=True) is a ModuleList of one LayerNorm(d_head) per KV head,
    whose forward splits dim 1 of [batch, kv_heads, pos, d_head]; probed with [1, d_head] it raised and norm_range
    gave None, so kv read the first key's norm as a measurement. By hand, head h's output w_h * x_hat + b_h, with
    |w_h * x_hat| in [4 min|w_h|, 4 max|w_h|] over d_head = 16 entries, has a norm within |b_h| of that (the triangle
    inequality); the bounds are the union over heads, and the module's own outputs on random keys stay inside."""
    from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead

    g = torch.Generator().manual_seed(4)
    module = StableLmLayerNormPerHead(16, 2, bias=bias)
    with torch.no_grad():
        for norm in module.norms:
            norm.weight.copy_(torch.rand(16, generator=g) * 2 - 0.5)  # -0.5-1.5: |w| counts
            if bias:
                norm.bias.copy_(torch.rand(16, generator=g) * 0.2 - 0.1)
    w = [n.weight.detach().abs() for n in module.norms]
    b = [float(n.bias.detach().norm()) if bias else 0.0 for n in module.norms]
    low = min(max(0.0, 4 * float(wh.min()) - bh) for wh, bh in zip(w, b))
    high = max(4 * float(wh.max()) + bh for wh, bh in zip(w, b))
    got = norm_range(module, "k_layernorm", d_head=16)
    assert got is not None and got.per_head is True and got.dim == 16 and not got.rms
    assert got.kind == "StableLmLayerNormPerHead(LayerNorm)" and got.module == "k_layernorm"
    assert got.gain == pytest.approx((min(float(v.min()) for v in w), max(float(v.max()) for v in w)), rel=1e-5)
    assert got.bounds == pytest.approx((low, high), rel=1e-5)
    assert got.bias == pytest.approx(max(b), rel=1e-5, abs=1e-12)
    with torch.no_grad():  # [batch, kv_heads, pos, d_head], as StableLM's attention calls it
        norms = module(torch.randn(50, 2, 40, 16, generator=torch.Generator().manual_seed(1)) * 5).norm(dim=-1)
        assert low - 1e-4 <= float(norms.min()) and float(norms.max()) <= high + 1e-4
    ones = StableLmLayerNormPerHead(16, 2)  # untrained (weights 1, no bias): every key's norm is sqrt(16) = 4
    assert norm_range(ones, "k_layernorm", d_head=16).bounds == pytest.approx((4.0, 4.0), rel=1e-5)


def test_key_norms_on_a_stablelm_with_qk_layernorm_say_not_reported(tmp_path):
    """Review 17a A1, end to end on a tiny StableLM (qk_layernorm, 2 KV heads): key_norms finds every layer's
    k_layernorm with the bounds read by hand from Hugging Face's per-head weights, and the kv finding says the first
    key's norm is not reported instead of "does not stand out"."""
    import pandas as pd
    import transformers

    import headscope as hs
    from headscope.analyses.kv.analysis import key_norm_record
    from headscope.models.key_norm import key_norms
    from headscope.reports.plots_kv import finding
    from tests_support import save_random_checkpoint, word_tokenizer

    config = transformers.StableLmConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, qk_layernorm=True,
                                         max_position_embeddings=32, bos_token_id=2, eos_token_id=3, pad_token_id=1)
    g = torch.Generator().manual_seed(5)

    def init(hf) -> None:
        for layer in hf.model.layers:
            for norm in layer.self_attn.k_layernorm.norms:
                norm.weight.copy_(torch.rand(16, generator=g) + 0.5)  # 0.5-1.5

    hf = save_random_checkpoint(config, tmp_path / "m", word_tokenizer(), init=init).eval()
    model = hs.load_model(tmp_path / "m", device="cpu", dtype="float32")
    found = key_norms(model)
    for layer, got in zip(hf.model.layers, found):
        w = [n.weight.detach() for n in layer.self_attn.k_layernorm.norms]
        assert got is not None and got.per_head
        assert got.bounds == pytest.approx((4 * min(float(v.min()) for v in w), 4 * max(float(v.max()) for v in w)),
                                           rel=1e-5)
    w = torch.cat([n.weight.detach() for layer in hf.model.layers for n in layer.self_attn.k_layernorm.norms])
    lo, hi = float(w.min()), float(w.max())
    record = key_norm_record(model, pd.DataFrame({"kind": [], "layer": [], "norm": []}))
    assert record["layers"] == [0, 1] and record["bounds"] == pytest.approx([4 * lo, 4 * hi], rel=1e-5)
    text = finding({"keys_normalised": True, "sink_key_norm_ratio_per_layer": {"0": 1.0, "1": 1.1}, "key_norm": record})
    assert (f"Keys are normalised per head (k_layernorm) before caching, so their norms are set by the norm's weight, "
            f"not by the key's input (here {4 * lo:.2f}-{4 * hi:.2f}: sqrt(16) x its |weight| {lo:.2f}-{hi:.2f}; "
            "smaller only for a key near zero against the norm's epsilon), and the first key's norm cannot mark a sink: "
            "not reported.") in text
    assert "does not stand out" not in text
    biased = finding({"keys_normalised": True, "key_norm": {**record, "bias": 0.123}})
    assert f"sqrt(16) x its |weight| {lo:.2f}-{hi:.2f}, give or take its bias's norm (up to 0.12);" in biased
