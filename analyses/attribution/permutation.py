"""Permutation test of attention (Jain & Wallace 2019): shuffle the weights, see if the output cares.

At one layer, every head's attention weights over the keys are replaced by a random permutation
of themselves (an independent permutation per head and per draw). For decoders only the
prediction's query row (the last position) is permuted, so causality is kept; for encoders every
query row of a head is permuted with the head's draw. The output change (TVD of the next-token
distribution, or 1 - cosine of the pooled embedding) is summarised per example by its median
over draws, to plot against the maximum attention.

How: the pattern and the values of the layer are read once at hook_pattern and hook_v (nothing
before the layer changes under the permutation), and each permuted run writes
z = permuted pattern @ v at hook_z. Writing z rather than editing hook_pattern works for every
architecture: TransformerLens discards hook_pattern edits on bridges that delegate attention to
the Hugging Face module (BERT), while hook_z edits always take effect.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from headscope.analyses.attribution.methods import prediction, prediction_change
from headscope.errors import ConfigError
from headscope.hooks.sites import site


def permutations(n_draws: int, n_heads: int, n_keys: int, generator: torch.Generator) -> torch.Tensor:
    """[draw, head, key] random permutations of range(n_keys)."""
    return torch.rand(n_draws, n_heads, n_keys, generator=generator).argsort(-1)


Generators = torch.Generator | Sequence[torch.Generator] | None


def per_example(generator: Generators, batch: int, draw: Callable[[int, torch.Generator], torch.Tensor]) -> torch.Tensor:
    """draw(rows, generator) -> [rows, ...] for a batch: one call with a shared generator (None: seed 0),
    or one row per example from its own generator (a sequence of `batch`), which makes an example's
    draws independent of the batch it is in."""
    if generator is None or isinstance(generator, torch.Generator):
        return draw(batch, generator or torch.Generator().manual_seed(0))
    if len(generator) != batch:
        raise ConfigError(f"got {len(generator)} generators for {batch} examples; pass one per example or one in all.")
    return torch.cat([draw(1, g) for g in generator])


def permuted_z(rows: torch.Tensor, v: torch.Tensor, perms: torch.Tensor) -> torch.Tensor:
    """rows [batch, head, r, k] attention rows, v [batch, k, head, d_head] values (KV heads already
    repeated), perms [batch, head, k] -> z [batch, r, head, d_head] of the permuted rows."""
    idx = perms[:, :, None, :].expand_as(rows)  # [batch, head, r, k]
    return torch.einsum("bhrk,bkhd->brhd", rows.gather(-1, idx), v)


def z_hook(new_z: torch.Tensor):
    """A hook_z hook writing new_z [batch, r, head, d_head] over the last r positions."""

    def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # [batch, pos, head, d_head]
        out = z.clone()
        out[:, -new_z.shape[1] :] = new_z.to(z.dtype)
        return out

    return hook


@torch.no_grad()
def prediction_rows(model, tokens: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One clean run -> (prediction [batch, out], the attention rows that feed it [batch, head, r, k]
    (the last row for decoders, every row for encoders), values [batch, k, head, d_head] with the
    KV heads repeated). Nothing before `layer` changes when those rows do, so these are reused."""
    facts = model.facts
    seen: dict[str, torch.Tensor] = {}

    def keep(key: str):
        def hook(act: torch.Tensor, hook: Any) -> None:
            seen[key] = act.detach()

        return hook

    fwd = [(site("pattern", layer), keep("pattern")), (site("v", layer), keep("v"))]
    ref = prediction(model, model.run_with_hooks(tokens, fwd=fwd))  # [batch, out]
    pattern = seen["pattern"]  # [batch, head, q, k]
    rows = pattern if facts.is_encoder else pattern[:, :, -1:]  # [batch, head, r, k]
    v = seen["v"].repeat_interleave(facts.n_heads // facts.n_kv_heads, dim=2)  # [batch, k, head, d_head]
    return ref, rows, v


@torch.no_grad()
def permutation_test(
    model,
    tokens: torch.Tensor,
    *,
    layer: int,
    n_permutations: int = 100,
    batch_size: int = 256,
    generator: Generators = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output change under permuted attention at `layer` -> ([batch, n_permutations], max attention [batch]).

    tokens: [batch, pos], unpadded. Max attention is the largest head-mean weight of the permuted
    rows (the last row for decoders, the mean row for encoders) in the unpermuted run. generator:
    one for the batch, or one per example (its draws then do not depend on the batch; per_example).
    """
    model.check_layer(layer)
    facts = model.facts
    ref, rows, v = prediction_rows(model, tokens, layer)
    max_attention = rows.float().mean(2).mean(1).max(-1).values  # [batch]
    batch, n = tokens.shape
    perms = per_example(generator, batch, lambda rows, g: permutations(rows * n_permutations, facts.n_heads, n, g))
    perms = perms.to(tokens.device)  # [batch*draw, head, k], example-major
    example = torch.arange(batch, device=tokens.device).repeat_interleave(n_permutations)  # [batch*draw]
    out = []
    for i in range(0, len(example), batch_size):
        ex = example[i : i + batch_size]
        new_z = permuted_z(rows[ex], v[ex], perms[i : i + batch_size])  # [chunk, r, head, d_head]
        pred = prediction(model, model.run_with_hooks(tokens[ex], fwd=[(site("z", layer), z_hook(new_z))]))
        out.append(prediction_change(model, pred, ref[ex]))
    return torch.cat(out).reshape(batch, n_permutations).cpu(), max_attention.cpu()
