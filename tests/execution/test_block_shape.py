"""execution/block_shape.norm_gain: a norm's per-entry gain read from what the module computes, against
the formulas transformers and torch document for it (review 8b C7)."""
from __future__ import annotations

import pytest
import torch

from headscope.errors import UnsupportedModelError
from headscope.execution.block_shape import norm_gain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_gain_is_each_norms_own_multiplier_and_a_non_norm_is_refused(dtype):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    g = torch.Generator().manual_seed(0)
    spread = torch.rand(63, generator=g) * 1.5 + 0.25  # [63] an odd width: alternating signs do not sum to 0
    gemma, olmo, layer = Gemma2RMSNorm(63), Olmo2RMSNorm(63), torch.nn.LayerNorm(63)
    with torch.no_grad():
        gemma.weight.copy_(spread - 1.0)  # Gemma2RMSNorm multiplies by 1 + weight
        olmo.weight.copy_(spread)  # Olmo2RMSNorm by weight
        layer.weight.copy_(spread), layer.bias.normal_(0.0, 1.0, generator=g)  # LayerNorm centres, then weight, + bias
    for norm, centres in ((gemma, False), (olmo, False), (layer, True)):
        gain, centred = norm_gain(norm.to(dtype))  # bfloat16 weights: the gain of the stored weights, exactly
        assert centred is centres and gain.dtype == torch.float32
        want = spread.to(dtype).float() if norm is not gemma else (spread - 1.0).to(dtype).float() + 1.0
        torch.testing.assert_close(gain, want, rtol=1e-6, atol=1e-6)

    class Squash(torch.nn.Module):  # a gain, but not of x / rms(x)
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(spread.clone())

        def forward(self, x):
            return self.weight * torch.tanh(x / 64.0)

    with pytest.raises(UnsupportedModelError, match="Squash is not a norm"):
        norm_gain(Squash().to(dtype))
