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
