"""Permutation test of attention (Jain & Wallace 2019): shuffle the weights, see if the output cares.

At one layer, every head's attention weights over the keys are replaced by a random permutation
of themselves (an independent permutation per head and per draw) within the row's support: the
keys the model's mask lets the query see (`key_support`: causal, and the last `window` keys on a
sliding-window layer, models.layer_windows; the tokens are unpadded). Permuting over every key
would move weight onto keys the window masks, a read the model cannot make (review 9a A1); a zero
weight inside the window is still a key and takes part. For decoders only the
prediction's query row (the last position) is permuted, so causality is kept, and on a masked LM scored at its
mask (analyses/core/mask_read.py) the mask's row, where the answer is read; for other encoders every
query row of a head is permuted with the head's draw. The output change (TVD of the next-token
distribution, or 1 - cosine of the pooled embedding) is summarised per example by its median
over draws, to plot against the maximum attention. With a `score` (the task metric from the
logits), each draw's change of that metric is kept too, in its own units (logits, nats): where the
clean output is saturated (the top token's probability near 1) a distribution distance cannot move
whatever the layer does, while the metric still can (`saturation`).

How: the pattern and the values of the layer are read once at hook_pattern and hook_v (nothing
before the layer changes under the permutation), and each permuted run writes
z = permuted pattern @ v at hook_z. Writing z rather than editing hook_pattern works for every
architecture: TransformerLens discards hook_pattern edits on bridges that delegate attention to
the Hugging Face module (BERT), while hook_z edits always take effect.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headscope.analyses.attribution.methods import Score, answer_logits, prediction, prediction_change
from headscope.errors import ConfigError
from headscope.hooks.sites import site
from headscope.models.hooked_model import layer_windows, visible_keys


def permutations(n_draws: int, n_heads: int, n_keys: int, generator: torch.Generator,
                 support: torch.Tensor | None = None) -> torch.Tensor:
    """[draw, head, key] random permutations of range(n_keys) that move only the keys in `support`
    ([key] bool; None: every key) among themselves and leave the others in place. With every key in
    the support the draws are those of the plain permutation of n_keys."""
    if support is None or bool(support.all()):
        return torch.rand(n_draws, n_heads, n_keys, generator=generator).argsort(-1)
    inside = support.nonzero()[:, 0].cpu()  # [m] the keys that move
    local = torch.rand(n_draws, n_heads, len(inside), generator=generator).argsort(-1)  # [draw, head, m]
    out = torch.arange(n_keys).repeat(n_draws, n_heads, 1)  # [draw, head, key]
    out[:, :, inside] = inside[local]
    return out


def key_support(model, layer: int, n_keys: int) -> torch.Tensor:
    """[key] bool: the keys the permuted rows may attend to at `layer` under the model's mask, for
    unpadded sequences of n_keys tokens. Decoders permute the last row: every key (causal) but, on a
    sliding-window layer, only the last `window` (models.visible_keys). Encoders: every key."""
    return visible_keys(n_keys - 1, torch.arange(n_keys), layer_windows(model)[layer])


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


def z_hook(new_z: torch.Tensor, at: torch.Tensor | None = None):
    """A hook_z hook writing new_z [batch, r, head, d_head] over the last r positions, or (r = 1) at each row's
    mask `at` [batch]."""

    def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # [batch, pos, head, d_head]
        out = z.clone()
        if at is not None:
            out[torch.arange(z.shape[0], device=z.device), at.to(z.device)] = new_z[:, 0].to(z.dtype)
            return out
        out[:, -new_z.shape[1] :] = new_z.to(z.dtype)
        return out

    return hook


@torch.no_grad()
def prediction_rows(model, tokens: torch.Tensor, layer: int,
                    at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One clean run -> (prediction [batch, out], the attention rows that feed it [batch, head, r, k]
    (the last row for decoders, the mask's row at `at` [batch] for a masked LM scored there, every row for other
    encoders), values [batch, k, head, d_head] with the KV heads repeated, the answer logits [batch, 1, vocab] for
    a Score). Nothing before `layer` changes when those rows do, so these are reused."""
    facts = model.facts
    seen: dict[str, torch.Tensor] = {}

    def keep(key: str):
        def hook(act: torch.Tensor, hook: Any) -> None:
            seen[key] = act.detach()

        return hook

    fwd = [(site("pattern", layer), keep("pattern")), (site("v", layer), keep("v"))]
    out = model.run_with_hooks(tokens, fwd=fwd)  # [batch, pos, vocab]
    ref = prediction(model, out, at)  # [batch, out]
    pattern = seen["pattern"]  # [batch, head, q, k]
    if at is not None:  # the mask's row
        rows = pattern[torch.arange(len(pattern), device=pattern.device), :, at.to(pattern.device)][:, :, None]
    else:
        rows = pattern if facts.is_encoder else pattern[:, :, -1:]  # [batch, head, r, k]
    v = seen["v"].repeat_interleave(facts.n_heads // facts.n_kv_heads, dim=2)  # [batch, k, head, d_head]
    return ref, rows, v, answer_logits(model, out, at)


SATURATED = 0.99  # the clean top-token probability from which an example's output counts as saturated


@dataclass(frozen=True)
class Permuted:
    change: torch.Tensor  # [batch, draw] output change (TVD, or 1 - cosine for encoders)
    max_attention: torch.Tensor  # [batch] largest head-mean weight of the permuted rows
    top_prob: torch.Tensor | None  # [batch] the clean run's largest next-token probability (decoders)
    metric_change: torch.Tensor | None  # [batch, draw] score(permuted) - score(clean), with a score
    perms: torch.Tensor | None = None  # [batch, draw, head, key] the permutation each draw applied to each head's rows


def saturation(top_prob: Sequence[float], *, threshold: float = SATURATED) -> dict[str, Any]:
    """How saturated the clean outputs are, for the summary: the share of examples whose top token has
    p >= threshold, the median headroom 1 - p, and the most TVD a change of at most one logit in the top
    token's odds can give at that headroom, e (1 - p): the TVD of two distributions is at most the larger
    of their masses off the top token, and lowering its odds by one logit multiplies 1 - p by at most e.
    `is_saturated` when most examples are: then a distribution distance cannot show an effect of a logit
    or so, however much the layer matters for the task metric."""
    p = [float(x) for x in top_prob]
    if not p:
        return {"is_saturated": False, "n_examples": 0}
    k = sum(x >= threshold for x in p)
    headroom = statistics.median(1.0 - x for x in p)
    floor = min(1.0, math.e * headroom)  # a TVD is at most 1
    saturated = k > len(p) / 2
    return {
        "is_saturated": saturated, "share": k / len(p), "n_saturated": k, "n_examples": len(p), "threshold": threshold,
        "median_headroom": headroom, "tvd_per_logit": floor,
        "why": (f"the top token has p >= {threshold} on {k} of {len(p)} examples (median 1 - p = {headroom:.2g}), so a "
                f"change of up to one logit in its odds moves the total variation distance by at most about {floor:.2g}")
        if saturated else f"the top token has p >= {threshold} on {k} of {len(p)} examples, not most",
    }


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
    permute_attention returns the same with the clean top-token probability and a metric's change.
    """
    found = permute_attention(model, tokens, layer=layer, n_permutations=n_permutations, batch_size=batch_size,
                              generator=generator)
    return found.change, found.max_attention


@torch.no_grad()
def permute_attention(
    model,
    tokens: torch.Tensor,
    *,
    layer: int,
    n_permutations: int = 100,
    batch_size: int = 256,
    generator: Generators = None,
    score: Score | None = None,
    at: torch.Tensor | None = None,
) -> Permuted:
    """permutation_test's draws -> Permuted: the output changes, the max attention, the clean top-token
    probability (decoders, a masked LM at its mask) and, with `score` (the task metric of the answer logits of given
    examples), each draw's change of that metric [batch, draw] in its own units. at [batch]: a masked LM's mask
    positions, where its answer is read: only the mask's row is permuted and the output read there."""
    model.check_layer(layer)
    facts = model.facts
    ref, rows, v, last = prediction_rows(model, tokens, layer, at)
    max_attention = rows.float().mean(2).mean(1).max(-1).values  # [batch]
    batch, n = tokens.shape
    support = key_support(model, layer, n)  # [key] what the mask lets the rows see: only these move
    perms = per_example(generator, batch,
                        lambda rows, g: permutations(rows * n_permutations, facts.n_heads, n, g, support))
    perms = perms.to(tokens.device)  # [batch*draw, head, k], example-major
    example = torch.arange(batch, device=tokens.device).repeat_interleave(n_permutations)  # [batch*draw]
    clean = None if score is None else score(last.float(), torch.arange(batch, device=tokens.device))  # [batch]
    out, moved = [], []
    for i in range(0, len(example), batch_size):
        ex = example[i : i + batch_size]
        new_z = permuted_z(rows[ex], v[ex], perms[i : i + batch_size])  # [chunk, r, head, d_head]
        where = None if at is None else at[ex]  # [chunk] the rows' masks
        logits = model.run_with_hooks(tokens[ex], fwd=[(site("z", layer), z_hook(new_z, where))])
        out.append(prediction_change(model, prediction(model, logits, where), ref[ex],
                                     pooled=None if at is None else False))
        if score is not None:
            moved.append(score(answer_logits(model, logits, where).float(), ex) - clean[ex])
    shape = (batch, n_permutations)
    return Permuted(change=torch.cat(out).reshape(shape).cpu(), max_attention=max_attention.cpu(),
                    top_prob=None if facts.is_encoder and at is None else ref.max(-1).values.cpu(),
                    metric_change=torch.cat(moved).reshape(shape).cpu() if moved else None,
                    perms=perms.reshape(batch, n_permutations, facts.n_heads, n).cpu())
