"""capture: run a forward pass and keep only the requested sites.

Memory is proportional to what was asked for: one hook per requested site, an optional
position selection applied inside the hook, and an optional move to CPU. Per-head outputs
(`blocks.L.attn.hook_result`) are computed from hook_z and W_O inside the hook.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from headscope.hooks.sites import COMPUTED, SITES, check_site, parse_site, site
from headscope.errors import ConfigError, IndexOutOfRangeError

Positions = int | Sequence[int] | slice | torch.Tensor | None


class Activations(dict):
    """name -> tensor, plus `output` (logits for decoders, hidden states for encoders)."""

    output: torch.Tensor | None = None


def position_index(positions: Positions, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Positions (None = all, int, list, slice, tensor; negatives count from the end) as an index tensor."""
    if positions is None:
        return torch.arange(length, device=device)
    if isinstance(positions, slice):
        return torch.arange(length, device=device)[positions]
    idx = torch.as_tensor([positions] if isinstance(positions, int) else positions, device=device).reshape(-1)
    if idx.numel() and (int(idx.min()) < -length or int(idx.max()) >= length):
        raise IndexOutOfRangeError(f"positions {idx.tolist()} out of range for a sequence of {length} tokens.")
    return idx % length


def select_positions(act: torch.Tensor, positions: Positions, dim: int) -> torch.Tensor:
    """Keep the given positions along `dim`; an int keeps the axis (length 1)."""
    if positions is None:
        return act
    return act.index_select(dim, position_index(positions, act.shape[dim], act.device))


def head_result(model, layer: int, z: torch.Tensor) -> torch.Tensor:
    """Per-head output from z: [batch, pos, head, d_head] @ W_O[head] -> [batch, pos, head, d_model]."""
    w_o = model.bridge.blocks[layer].attn.W_O  # [head, d_head, d_model]
    return torch.einsum("bphd,hdm->bphm", z, w_o.to(z.dtype))


def hook_point_for(name: str) -> str:
    """The real hook point behind a site (computed sites read from hook_z)."""
    kind, layer = parse_site(name)
    return site("z", layer) if kind in COMPUTED else name


def capture(
    model,
    tokens: torch.Tensor,
    sites: str | Iterable[str],
    positions: Positions = None,
    to_cpu: bool = False,
    *,
    attention_mask: torch.Tensor | None = None,
    grad: bool = False,
) -> Activations:
    """One forward pass; returns Activations holding exactly the requested sites.

    positions selects query positions (axis 1, or axis 2 of scores/pattern) inside the hook, so
    unselected positions are never stored. `grad=True` keeps the graph (no detach, no no_grad).
    """
    names = [sites] if isinstance(sites, str) else list(sites)
    if not names:
        raise ConfigError("capture needs at least one site name, e.g. site('resid_post', 0).")
    for name in names:
        check_site(model, name)
    store = Activations()

    def make_hook(name: str):
        kind, layer = parse_site(name)
        dim = SITES[kind].pos_dim

        def hook(act: torch.Tensor, hook: Any) -> None:
            if kind in COMPUTED:
                act = head_result(model, layer, act)
            act = select_positions(act, positions, dim)
            if not grad:
                act = act.detach()
            store[name] = act.to("cpu") if to_cpu else act

        return hook

    fwd = [(hook_point_for(name), make_hook(name)) for name in names]
    with torch.set_grad_enabled(grad):
        store.output = model.run_with_hooks(tokens, fwd=fwd, attention_mask=attention_mask)
    if not grad:
        store.output = store.output.detach()
    return store
