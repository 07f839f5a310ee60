"""Grouped Falcon's fused query_key_value, split as Hugging Face reads it.

On a new-decoder-architecture Falcon (Falcon-40B/180B, Falcon2: `new_decoder_architecture=True`, `num_kv_heads`
KV heads) Hugging Face stores the fused projection per KV group, [q x heads per group, k, v] for each group
(FalconAttention._split_heads views it [kv, group + 2, d_head]). TransformerLens 4.3's adapter splits it as one
contiguous [Q | K | V] block, so its q, k and v (and every hook, pattern and logit after them) are wrong, logits off
by whole units; with `multi_query=True` besides (Falcon-40B's config) it takes one KV head where Hugging Face takes
`num_kv_heads` and fails to load. `grouped_split()`, open while the bridge boots, gives the adapter the grouped split
and the config's KV heads; query head h then reads KV head h // group, as in Hugging Face. Other Falcons (the old
decoder architecture, multi-query or per-head interleaved) keep TransformerLens's own split, which is right there.
The conversion probe (models/conversion_check.py) checks the result against Hugging Face's own forward.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _grouped(fused: torch.Tensor, n_kv: int, group: int, d_head: int) -> tuple[torch.Tensor, ...]:
    """fused [kv * (group + 2) * d_head, ...] (a weight's rows or a bias) -> (q [kv * group * d_head, ...],
    k [kv * d_head, ...], v [kv * d_head, ...]), query heads in Hugging Face's order (group-major)."""
    rest = fused.shape[1:]
    per = fused.reshape(n_kv, group + 2, d_head, *rest)  # [kv, group + 2, d_head, ...]
    return (per[:, :group].reshape(n_kv * group * d_head, *rest), per[:, group].reshape(n_kv * d_head, *rest),
            per[:, group + 1].reshape(n_kv * d_head, *rest))


@contextmanager
def grouped_split() -> Iterator[None]:
    """While open, TransformerLens's Falcon adapter splits a new-decoder-architecture model's fused qkv per KV
    group and keeps the config's KV heads (multi_query too); restored on exit."""
    from transformer_lens.conversion_utils.conversion_steps import RearrangeTensorConversion
    from transformer_lens.conversion_utils.param_processing_conversion import ParamProcessingConversion
    from transformer_lens.model_bridge.supported_architectures.falcon import FalconArchitectureAdapter as Adapter

    init, split = Adapter.__init__, Adapter._split_falcon_qkv

    def grouped_init(self: Any, cfg: Any) -> None:
        n_kv = getattr(cfg, "n_key_value_heads", None)
        init(self, cfg)
        if self._is_new_arch and self._is_multi_query and n_kv:  # Hugging Face ignores multi_query here
            self.cfg.n_key_value_heads = n_kv
            for part in ("k", "v"):
                self.weight_processing_conversions[f"blocks.{{i}}.attn.{part}"] = ParamProcessingConversion(
                    tensor_conversion=RearrangeTensorConversion("(n h) m -> n m h", n=n_kv))

    def grouped_qkv(self: Any, attention: Any) -> tuple[torch.nn.Linear, torch.nn.Linear, torch.nn.Linear]:
        if not self._is_new_arch:
            return split(self, attention)
        qkv = attention.query_key_value
        n_heads = self.cfg.n_heads
        n_kv = self.cfg.n_key_value_heads or n_heads
        d_head = self.cfg.d_model // n_heads
        weights = _grouped(qkv.weight.detach().clone(), n_kv, n_heads // n_kv, d_head)
        biases = (_grouped(qkv.bias.detach().clone(), n_kv, n_heads // n_kv, d_head) if qkv.bias is not None
                  else (None, None, None))
        out = []
        for w, b in zip(weights, biases):
            linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
            linear.weight = torch.nn.Parameter(w.contiguous())
            if b is not None:
                linear.bias = torch.nn.Parameter(b.contiguous())
            out.append(linear)
        return out[0], out[1], out[2]

    Adapter.__init__, Adapter._split_falcon_qkv = grouped_init, grouped_qkv
    try:
        yield
    finally:
        Adapter.__init__, Adapter._split_falcon_qkv = init, split
