"""MLP layers as key-value memories (Geva et al. 2021).

FF(x) = f(x K^T) V (+ b): keys K are the rows of the input weight (d_mlp x d_model), values V
the columns of the output weight, laid out as rows (d_mlp x d_model), and the memory
coefficients m = f(x K^T) are the activations at mlp.hook_post. For gated MLPs
(SwiGLU), m = act(x W_gate) * (x W_in); `keys` are the up-projection rows and `gate_keys` the
gate rows. Either way MLP(x) = sum_i m_i v_i + b_out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class MLPMemories:
    layer: int
    keys: torch.Tensor  # [d_mlp, d_model] rows of the input (up) weight
    values: torch.Tensor  # [d_mlp, d_model] columns of the output weight, one row per neuron
    gate_keys: torch.Tensor | None  # [d_mlp, d_model] rows of the gate weight (gated MLPs)
    key_bias: torch.Tensor | None  # [d_mlp]
    out_bias: torch.Tensor  # [d_model] (zeros where the model has none)

    @property
    def gated(self) -> bool:
        return self.gate_keys is not None

    def output(self, coefficients: torch.Tensor) -> torch.Tensor:
        """sum_i m_i v_i + b: [..., d_mlp] coefficients -> [..., d_model] MLP output."""
        return coefficients @ self.values.to(coefficients.dtype) + self.out_bias.to(coefficients.dtype)

    def sub_updates(self, coefficients: torch.Tensor) -> torch.Tensor:
        """Each memory's contribution m_i v_i: [..., d_mlp] -> [..., d_mlp, d_model]."""
        return coefficients.unsqueeze(-1) * self.values.to(coefficients.dtype)


def mlp_memories(model, layer: int) -> MLPMemories:
    """Keys, values and biases of one MLP layer, for plain and gated MLPs alike."""
    model.check_layer(layer)
    mlp = model.bridge.blocks[layer].mlp
    w_in = mlp.W_in.detach()  # [d_model, d_mlp]
    w_out = mlp.W_out.detach()  # [d_mlp, d_model]
    w_gate = getattr(mlp, "W_gate", None)
    b_in = getattr(mlp, "b_in", None)
    b_out = getattr(mlp, "b_out", None)
    return MLPMemories(
        layer=layer,
        keys=w_in.T.contiguous(),
        values=w_out.contiguous(),
        gate_keys=None if w_gate is None else w_gate.detach().T.contiguous(),
        key_bias=None if b_in is None else b_in.detach(),
        out_bias=torch.zeros(w_out.shape[1], dtype=w_out.dtype, device=w_out.device) if b_out is None else b_out.detach(),
    )
