"""Per-head writes and per-head q/k/v inputs computed by headscope, for bridges that do not make them.

TransformerLens's bridge computes `attn.hook_result` (each head's write) and the split
`attn.hook_{q,k,v}_input` (one copy of the residual stream per head, normed by the head itself)
only for its JointQKV / PositionEmbeddings attention bridges; GPT-J's plain AttentionBridge
refuses both (review 15b A1). The edge graph needs them, and they follow from the weights:

- a head's write is z_h @ W_O[h] ([batch, pos, head, d_head] -> [batch, pos, head, d_model]; no b_O,
  as hook_result);
- head h's query reads norm(x_h) @ W_Q[h] + b_Q[h], x_h its own copy of the norm's input x (ln1's
  input, the residual stream before the norm), so the gradient of a metric M at x_h is the norm's
  vector-Jacobian product at x with dM/dq_h @ W_Q[h]^T (`input_grad`), and replacing x_h by
  x_h - delta_h replaces q_h by norm(x_h - delta_h) @ W_Q[h] + b_Q[h] (`reproject`); keys and values
  the same per key-value head.

`check` refuses a model whose hook_q/k/v are not that projection of ln1's input (rotary applied
before the hook, another norm), so nothing here is used on a layout it does not describe.
"""
from __future__ import annotations

import copy

import torch

from headscope.errors import UnsupportedModelError

KINDS = ("q", "k", "v")


class HeadSplit:
    """Every layer's attention weights (used in float32): W[kind] [heads, d_model, d_head], b[kind]
    [heads, d_head] or None, W_O [heads, d_head, d_model], and a float32 copy of ln1."""

    def __init__(self, model, reason: str):
        self.name, self.reason = model.facts.name, reason
        if (clip := getattr(model.facts, "clip_qkv", None)) is not None:  # review 19a A4 (MPT): one line, no KeyError
            raise UnsupportedModelError(
                f"{self.name}: edge attribution needs each head's own q/k/v input; {reason}, and q, k and v are "
                f"clamped to +-{clip:g} (clip_qkv) after the projection, which headscope's split from the weights does "
                "not model, so edges are not computed; the logit lens and DLA stand.")
        self.layers = []
        for block in model.bridge.blocks:
            attn, ln1 = block.attn, getattr(block, "ln1", None)
            norm = getattr(ln1, "original_component", None)
            weights = {k: getattr(attn, f"W_{k.upper()}", None) for k in (*KINDS, "o")}
            if norm is None or any(not isinstance(w, torch.Tensor) for w in weights.values()):
                raise UnsupportedModelError(f"{self.name}: edge attribution needs each head's write and input; {reason}")
            biases = {k: getattr(attn, f"b_{k.upper()}", None) for k in KINDS}
            ln2 = getattr(block, "ln2", None)  # sequential blocks: the MLP's own norm; parallel: ln1
            mlp_norm = getattr(ln2, "original_component", None) if ln2 is not None else norm
            if mlp_norm is None:
                raise UnsupportedModelError(f"{self.name}: edge attribution needs each MLP's input; {reason}")
            self.layers.append({
                "mlp_norm": copy.deepcopy(mlp_norm).float().requires_grad_(False),
                "mlp_norm_input": f"blocks.{len(self.layers)}.{'ln2' if ln2 is not None else 'ln1'}.hook_in",
                "W": {k: weights[k].detach() for k in KINDS},
                "b": {k: b.detach() if isinstance(b, torch.Tensor) else None for k, b in biases.items()},
                "W_O": weights["o"].detach(),
                "norm": copy.deepcopy(norm).float().requires_grad_(False),
            })

    def n_heads(self, layer: int, kind: str) -> int:
        """Heads (q) or key-value heads (k, v) of `layer`."""
        return self.layers[layer]["W"][kind].shape[0]

    @staticmethod
    def norm_input(layer: int) -> str:
        """The hook of the norm's input x (the residual stream the heads read)."""
        return f"blocks.{layer}.ln1.hook_in"

    def mlp_norm_input(self, layer: int) -> str:
        """The hook of the MLP norm's input (ln2's, or ln1's on a parallel block)."""
        return self.layers[layer]["mlp_norm_input"]

    def mlp_input(self, layer: int, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The MLP's normed input [batch, pos, d_model] (float32) from its norm's input x less delta [batch, pos, d_model]."""
        return self.layers[layer]["mlp_norm"].to(x.device)(x.float() - delta.float())

    def mlp_input_grad(self, layer: int, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """dM/dx [batch, pos, d_model] at the MLP norm's input x from dM/d(normed input) grad [batch, pos, d_model]."""
        return _vjp(self.layers[layer]["mlp_norm"].to(x.device), x, grad)

    def result(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """z [batch, pos, head, d_head] -> each head's write [batch, pos, head, d_model] (float32)."""
        w_o = self.layers[layer]["W_O"].to(z.device, torch.float32)
        return torch.einsum("bphe,hed->bphd", z.float(), w_o)

    def project(self, layer: int, kind: str, normed: torch.Tensor) -> torch.Tensor:
        """normed [batch, pos, head, d_model] (each head's own normed input) -> [batch, pos, head, d_head]."""
        lay = self.layers[layer]
        out = torch.einsum("bphd,hde->bphe", normed, lay["W"][kind].to(normed.device, torch.float32))
        b = lay["b"][kind]
        return out if b is None else out + b.to(normed.device, torch.float32)

    def reproject(self, layer: int, kind: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """q/k/v [batch, pos, head, d_head] (float32) of the heads reading x [batch, pos, d_model] less
        their own delta [batch, pos, head, d_model]."""
        norm = self.layers[layer]["norm"].to(x.device)
        return self.project(layer, kind, norm(x.float()[:, :, None] - delta.float()))

    def input_grad(self, layer: int, kind: str, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """dM/dx_h [batch, pos, head, d_model] from dM/dq_h (k, v) grad [batch, pos, head, d_head] at the
        norm's input x [batch, pos, d_model]: W[kind][h] then the norm's vector-Jacobian product at x."""
        lay = self.layers[layer]
        g_normed = torch.einsum("bphe,hde->bphd", grad.float(), lay["W"][kind].to(grad.device, torch.float32))
        return _vjp(lay["norm"].to(x.device), x[:, :, None].expand(-1, -1, grad.shape[2], -1), g_normed)

    def check(self, layer: int, kind: str, x: torch.Tensor, act: torch.Tensor) -> None:
        """Refuse (UnsupportedModelError) where the captured hook_q/k/v act [batch, pos, head, d_head] is not
        this layer's projection of the normed x [batch, pos, d_model] (kind "mlp": mlp.hook_in [batch, pos,
        d_model] not the MLP norm of x): a relative error beyond 8 rounding steps of the model's dtype (never
        below 1e-3)."""
        if kind == "mlp":
            want, what = self.mlp_input(layer, x, torch.zeros_like(x)), "the MLP's input is not its norm's output"
        else:
            norm = self.layers[layer]["norm"].to(x.device)
            want = self.project(layer, kind, norm(x.float())[:, :, None].expand(-1, -1, act.shape[2], -1))
            what = f"its hook_{kind} is not ln1's output through W_{kind.upper()}"
        err = float((want - act.float()).norm() / want.norm().clamp_min(1e-12))
        if err > max(1e-3, 8 * float(torch.finfo(act.dtype).eps)):
            raise UnsupportedModelError(f"{self.name}: edge attribution needs each head's and MLP's own input; "
                                        f"{self.reason}, and {what} (relative error {err:.2g}), so headscope cannot "
                                        "split it.")


def _vjp(norm, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The norm's vector-Jacobian product at x [..., d_model] with grad [..., d_model], in float32."""
    xs = x.detach().float().contiguous().requires_grad_(True)
    with torch.enable_grad():
        (out,) = torch.autograd.grad(norm(xs), xs, grad.float())
    return out


def per_head(act: torch.Tensor, n: int) -> torch.Tensor:
    """[batch, pos, n * d_head] or [batch, pos, n, d_head] -> [batch, pos, n, d_head]."""
    return act if act.ndim == 4 else act.reshape(*act.shape[:2], n, -1)
