"""Interventions as context managers: ablation, differentiable head gates, patching.

Each one attaches hooks on entry and removes them on exit, exceptions included, so the model
is never left modified. Heads are intervened on at hook_z (a head's output is z_h @ W_O[h],
so changing z_h changes exactly that head's contribution); neurons at mlp.hook_post.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from headscope.errors import ConfigError, IndexOutOfRangeError, ShapeMismatchError, SiteError, UnsupportedModelError
from headscope.hooks.capture import Positions, capture, position_index
from headscope.hooks.edits import require_edits
from headscope.hooks.memories import is_moe
from headscope.hooks.sites import SITES, check_site, parse_site, site

# The ablation methods, here and in the heads analysis (analyses.heads.importance.ABLATIONS):
# "zero"; "mean" (the reference prompts' mean, per position); "resample" (each row takes another
# example's activation, never its own: `resample_partners`).
METHODS = ("zero", "mean", "resample")


def resample_partners(n_rows: int, n_ref: int, generator: torch.Generator) -> torch.Tensor:
    """Resample ablation's pairing: row i takes reference row partner[i] [n_rows] = (i + r_i) %
    n_ref, r_i uniform in 1..n_ref - 1 and seeded by `generator` (on CPU). So partner[i] is
    never i mod n_ref: when the reference prompts are the input's own batch, no row ever gets
    its own activation back (resample ablation replaces an activation with another example's).
    Needs n_ref >= 2."""
    if n_ref < 2:
        raise ConfigError(f"resample ablation needs at least 2 reference examples to take activations from; got {n_ref}.")
    return (torch.arange(n_rows) + torch.randint(1, n_ref, (n_rows,), generator=generator)) % n_ref


def _replacement(method: str, ref: torch.Tensor | None, act: torch.Tensor,
                 partners: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """What replaces `act` [batch, pos, ...] under the ablation method; partners(batch) is the
    resample pairing of this batch size (see resample_partners)."""
    if method == "zero":
        return torch.zeros_like(act)
    assert ref is not None
    if method == "mean":
        if ref.shape[1] == act.shape[1]:
            return ref.mean(0, keepdim=True).expand_as(act)  # per-position mean over the reference
        return ref.mean((0, 1), keepdim=True).expand_as(act)  # lengths differ: mean over all positions
    if ref.shape[1] != act.shape[1]:
        raise ShapeMismatchError(
            f"resample ablation needs reference prompts of the same length as the input "
            f"({ref.shape[1]} vs {act.shape[1]} tokens); pass reference tokens of length {act.shape[1]}."
        )
    return ref[partners(act.shape[0]).to(ref.device)]


@contextmanager
def ablate(
    model,
    *,
    heads: Sequence[tuple[int, int]] = (),
    neurons: Sequence[tuple[int, int]] = (),
    sites: Sequence[str] = (),
    positions: Positions = None,
    method: str = "zero",
    reference: torch.Tensor | None = None,
    seed: int = 0,
) -> Iterator[None]:
    """Ablate heads (layer, head), MLP neurons (layer, index) and whole sites, optionally only at `positions`.

    method: "zero"; "mean" (mean over the `reference` prompts, per position when their length
    matches the input, else over all positions); "resample" (input row i takes, at every
    ablated site, the activation of reference row partner[i], drawn once per batch size from
    `seed` and never row i itself (resample_partners): with the input batch as its own
    reference, a row never gets its own activation back; needs 2+ reference prompts).
    """
    if method not in METHODS:
        raise ConfigError(f"Unknown ablation method {method!r}; use one of {METHODS}.")
    if method != "zero" and reference is None:
        raise ConfigError(f"{method} ablation needs reference= token ids to take activations from.")
    if not heads and not neurons and not sites:
        raise ConfigError("ablate needs at least one of heads=, neurons= or sites=.")
    targets: dict[str, list] = defaultdict(list)  # site -> [(axis, index)] or [None] for the whole site
    for layer, head in heads:
        model.check_head(layer, head)
        targets[site("z", layer)].append(head)
    for layer, neuron in neurons:
        model.check_layer(layer)
        if is_moe(model, layer):
            raise UnsupportedModelError(f"ablate(neurons=...) acts at mlp.hook_post, which on layer {layer}'s mixture "
                                        f"of experts is the block's output, not its experts' neurons; ablate sites or heads.")
        if not 0 <= neuron < model.facts.d_mlp:
            raise IndexOutOfRangeError(f"neuron {neuron} out of range: layer {layer} has neurons 0..{model.facts.d_mlp - 1}.")
        targets[site("mlp_post", layer)].append(neuron)
    for name in sites:
        check_site(model, name)
        _require_editable(model, name, "ablate")
        targets[name].append(None)
    refs = {}
    if reference is not None:
        refs = capture(model, reference, list(targets))
    n_ref = next(iter(refs.values())).shape[0] if refs else 0
    if method == "resample" and n_ref < 2:
        raise ConfigError(f"resample ablation needs at least 2 reference prompts (a row never takes its own "
                          f"activation); got {n_ref}.")
    gen = torch.Generator().manual_seed(seed)
    pairings: dict[int, torch.Tensor] = {}  # batch size -> partner rows, shared by every site

    def partners(n_rows: int) -> torch.Tensor:
        if n_rows not in pairings:
            pairings[n_rows] = resample_partners(n_rows, n_ref, gen)
        return pairings[n_rows]

    def make_hook(name: str, units: list):
        kind, _ = parse_site(name)
        unit_dim = 2  # heads at axis 2 of z, neurons at axis 2 of mlp_post

        def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
            new = _replacement(method, refs.get(name), act, partners)
            pos = position_index(positions, act.shape[1], act.device)
            mask = torch.zeros(act.shape[1], dtype=torch.bool, device=act.device)
            mask[pos] = True
            shape = [1, act.shape[1]] + [1] * (act.ndim - 2)
            if None not in units:
                unit_mask = torch.zeros(act.shape[unit_dim], dtype=torch.bool, device=act.device)
                unit_mask[list(units)] = True
                shape_u = [1] * act.ndim
                shape_u[unit_dim] = act.shape[unit_dim]
                full = mask.view(shape) & unit_mask.view(shape_u)
            else:
                full = mask.view(shape)
            return torch.where(full, new.to(act.dtype), act)

        return hook

    with model.hooks(fwd=[(name, make_hook(name, units)) for name, units in targets.items()]):
        yield


@contextmanager
def head_gates(model, *, init: float = 1.0) -> Iterator[torch.Tensor]:
    """Differentiable per-head gates xi [n_layers, n_heads] that scale each head's z.

    At xi = 1 the model is unchanged; d metric / d xi_h is Michel et al.'s head importance.
    Yields the gate tensor (requires_grad); read `.grad` after a backward pass inside the block.
    """
    f = model.facts
    gates = torch.full((f.n_layers, f.n_heads), float(init), device=model.device, requires_grad=True)

    def make_hook(layer: int):
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
            return z * gates[layer].to(z.dtype).view(1, 1, -1, 1)  # [batch, pos, head, d_head]
        return hook

    with model.hooks(fwd=[(site("z", layer), make_hook(layer)) for layer in range(f.n_layers)]):
        yield gates


def _check_heads(model, name: str, src: torch.Tensor, heads: Sequence[int] | None) -> None:
    """Refuse out-of-range `heads` when the context is entered, not at the first forward. k and v are indexed
    by KV head, which under grouped-query or multi-query attention is shared by several query heads: say which."""
    kind = parse_site(name)[0]
    axis = SITES[kind].head_dim
    if heads is None or axis is None or src.ndim <= axis:
        return
    n = src.shape[axis]
    bad = [h for h in heads if not (isinstance(h, int) and 0 <= h < n)]
    if not bad:
        return
    f = model.facts
    if kind in ("k", "v", "rot_k") and f.n_kv_heads < f.n_heads and isinstance(bad[0], int) and 0 <= bad[0] < f.n_heads:
        group = f.n_heads // f.n_kv_heads
        owner = bad[0] // group
        heads_word = "KV head" if f.n_kv_heads == 1 else "KV heads"
        raise IndexOutOfRangeError(
            f"head {bad[0]!r} is out of range for {name}: {f.name} has {f.n_kv_heads} {heads_word} (0..{f.n_kv_heads - 1}), "
            f"each shared by {group} query heads, and k and v are indexed by KV head; query head {bad[0]!r} reads "
            f"KV head {owner} (query heads {owner * group}-{owner * group + group - 1}): use heads=[{owner}].")
    raise IndexOutOfRangeError(f"head {bad[0]!r} is out of range for {name}: {f.name} has heads 0..{n - 1} there.")


def _require_editable(model, name: str, what: str) -> None:
    """UnsupportedModelError in one line where `name` is a scores/pattern site whose edits TransformerLens
    discards on this model (hooks/edits.py, review 16d A3)."""
    kind = parse_site(name)[0]
    if kind in ("scores", "pattern"):
        require_edits(model, f"{what} at {name}", kind)


@contextmanager
def patch(
    model,
    source: Mapping[str, torch.Tensor],
    sites: str | Sequence[str],
    *,
    positions: Positions = None,
    heads: Sequence[int] | None = None,
) -> Iterator[None]:
    """Replace activations at `sites` by those in `source` (e.g. Activations from another run).

    positions: query positions to patch (None = all); heads: head indices to patch on sites
    with a head axis (None = all). The source tensor must have the activation's full shape.
    """
    names = [sites] if isinstance(sites, str) else list(sites)
    for name in names:
        check_site(model, name)
        if name not in source:
            raise SiteError(f"source has no activation for {name!r}; capture it first (capture(model, tokens, [{name!r}])).")
        if parse_site(name)[0] == "result":
            raise ConfigError("Patch per-head outputs at hook_z (site('z', layer)) with heads=[...]; hook_result is computed.")
        _check_heads(model, name, source[name], heads)
        _require_editable(model, name, "patch")

    def make_hook(name: str):
        kind, _ = parse_site(name)
        spec = SITES[kind]

        def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
            src = source[name]
            if src.shape != act.shape:
                raise ShapeMismatchError(
                    f"Cannot patch {name}: the source activation has shape {tuple(src.shape)} but the "
                    f"run has {tuple(act.shape)}. Clean and source prompts must have the same batch size and length."
                )
            mask = torch.zeros(act.shape[spec.pos_dim], dtype=torch.bool, device=act.device)
            mask[position_index(positions, act.shape[spec.pos_dim], act.device)] = True
            shape = [1] * act.ndim
            shape[spec.pos_dim] = act.shape[spec.pos_dim]
            full = mask.view(shape)
            if heads is not None and spec.head_dim is not None:
                for h in heads:
                    if not 0 <= h < act.shape[spec.head_dim]:
                        raise IndexOutOfRangeError(f"head {h} out of range for {name} with {act.shape[spec.head_dim]} heads.")
                head_mask = torch.zeros(act.shape[spec.head_dim], dtype=torch.bool, device=act.device)
                head_mask[list(heads)] = True
                shape_h = [1] * act.ndim
                shape_h[spec.head_dim] = act.shape[spec.head_dim]
                full = full & head_mask.view(shape_h)
            return torch.where(full, src.to(act.device, act.dtype), act)

        return hook

    with model.hooks(fwd=[(name, make_hook(name)) for name in names]):
        yield
