"""Scaled dot-product attention reproduces the four-token worked example of REFERENCES.md."""
from __future__ import annotations

import math

import pytest
import torch

import headscope as hs
from headscope.hooks import expand_kv_heads, scaled_dot_product
from tests_support import random_tokens


def test_four_token_worked_example():
    q = torch.tensor([[1.0, 1.0]])
    k = torch.tensor([[1.0, 0.0], [2.0, 2.0], [1.0, 1.0], [2.0, 1.0]])
    v = torch.tensor([[1.0, 0.0], [0.0, 4.0], [2.0, 0.0], [0.0, 2.0]])
    out, weights = scaled_dot_product(q, k, v)
    scores = q @ k.T / math.sqrt(2)
    assert scores[0].tolist() == pytest.approx([0.707107, 2.828427, 1.414214, 2.121320], abs=1e-6)
    assert weights[0].tolist() == pytest.approx([0.064585, 0.538776, 0.130985, 0.265654], abs=1e-6)
    assert out[0].tolist() == pytest.approx([0.326556, 2.686412], abs=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # NeoX's partial RoPE exposes no rotated q/k
def test_hooked_pattern_equals_attention_recomputed_from_hooked_q_and_k(family, tiny_models):
    model = tiny_models[family]
    rotary = model.facts.positional == "rotary"
    qs, ks = ("rot_q", "rot_k") if rotary else ("q", "k")
    names = [hs.site(qs, 1), hs.site(ks, 1), hs.site("v", 1), hs.site("pattern", 1), hs.site("z", 1)]
    acts = hs.capture(model, random_tokens(2, 9), names)
    q = acts[names[0]].transpose(1, 2)  # [batch, head, pos, d_head]
    k = expand_kv_heads(acts[names[1]], model.facts.n_heads).transpose(1, 2)
    v = expand_kv_heads(acts[names[2]], model.facts.n_heads).transpose(1, 2)
    z, pattern = scaled_dot_product(q, k, v, causal=True)
    assert (pattern - acts[names[3]]).abs().max().item() <= 1e-5
    assert (z.transpose(1, 2) - acts[names[4]]).abs().max().item() <= 1e-5
