"""capture and run_with_cache: run a forward pass and keep only the requested sites.

Memory is proportional to what was asked for: one hook per requested site, an optional
position selection applied inside the hook, and an optional move to CPU. Per-head outputs
(`blocks.L.attn.hook_result`) are computed from hook_z and W_O inside the hook, a mixture of
experts' memory coefficients (`mlp_post`) from the MLP's input (hooks.memories), and router
sites read as [batch * pos, ...] are given as [batch, pos, ...]. Attention scores
and patterns requested alone are recomputed on demand where the model allows (hooks/patterns).
`run_with_cache` is TransformerLens's habit: every site by default, an Activations cache back.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from headscope.errors import ConfigError, IndexOutOfRangeError, SiteError
from headscope.hooks import memories
from headscope.hooks.cache import Activations, head_result
from headscope.hooks.sites import COMPUTED, SITES, available_sites, check_site, hook_point, parse_site, routed_source, site
from headscope.models.tl_habits import provide

Positions = int | Sequence[int] | slice | torch.Tensor | None
_NORM_SCALE = re.compile(r"^(?:blocks\.\d+\.ln[12]|ln_final)\.hook_scale$")  # [batch, pos, 1]


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
    _warn_scores(model, names)
    return _run(model, tokens, names, positions, to_cpu, attention_mask, grad)


def _warn_scores(model, names: Sequence[str]) -> None:
    """A warning where a scores site is asked by name on a model whose hook_attn_scores holds the softmax weights
    (hooks.edits.scores_hold_weights; review 17d A3: GPT-Neo's, OPT's): the values are the pattern's."""
    if any(str(n).endswith("attn.hook_attn_scores") for n in names):
        from headscope.hooks.edits import scores_hold_weights
        from headscope.hooks.sites import SCORES_AS_WEIGHTS

        if scores_hold_weights(model):
            warnings.warn(f"hook_attn_scores of {model.facts.architecture}: {SCORES_AS_WEIGHTS}.", UserWarning,
                          stacklevel=3)


def run_with_cache(
    model,
    tokens: torch.Tensor,
    names: str | Iterable[str] | Callable[[str], bool] | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    positions: Positions = None,
    to_cpu: bool = False,
    names_filter: str | Iterable[str] | Callable[[str], bool] | None = None,
    site_positions: Mapping[str, Positions] | None = None,
) -> tuple[torch.Tensor, Activations]:
    """(output, Activations) of one forward pass, like TransformerLens's run_with_cache.

    names: None = every site the model computes (`available_sites`) plus the norm scales
    (`ln_final.hook_scale`, `blocks.L.ln1/ln2.hook_scale`, [batch, pos, 1], which apply_ln
    needs), but not the computed per-head `hook_result` sites: they cost n_heads x d_model per
    position, and `stack_head_results` computes them from hook_z (TransformerLens also leaves
    them out unless use_attn_result is set). A name, a list of names, or a filter callable
    (TransformerLens's names_filter, also accepted under that name) over the same names plus
    the hook_result sites selects. Activations are detached; positions and to_cpu are as in
    `capture` (the output stays on the model's device). site_positions: {name: positions} for some
    of the names, in place of `positions` (circuits keeps every position of the residual sites and
    only the answer's of a mixture of experts' `mlp_post`, whose memories are many).
    """
    if names is not None and names_filter is not None:
        raise ConfigError("run_with_cache got both names and names_filter; they are the same argument, pass one.")
    names = names if names is not None else names_filter
    scales = norm_scale_names(model)
    every = available_sites(model) + scales
    if names is None:
        wanted = [n for n in every if n in scales or parse_site(n)[0] not in COMPUTED]
    elif callable(names):
        wanted = [n for n in every if names(n)]
    else:
        wanted = [names] if isinstance(names, str) else list(names)
        for name in wanted:
            if name not in scales:
                check_site(model, name)
        _warn_scores(model, wanted)
    if not wanted:
        raise ConfigError("run_with_cache: names selected no site; see headscope.available_sites(model).")
    acts = _run(model, tokens, wanted, positions, to_cpu, attention_mask, False, site_positions)
    missing = [n for n in wanted if n in scales and not dict.__contains__(acts, n)]
    if missing and names is not None and not callable(names):  # asked for by name
        raise SiteError(f"{model.facts.name} never computes {missing}; leave them out.")
    return acts.output, acts


def norm_scale_names(model) -> list[str]:
    """The bridge's norm-scale hook points (ln1/ln2 per block, then ln_final), in forward order."""
    names = [f"blocks.{l}.ln{i}.hook_scale" for l in range(model.facts.n_layers) for i in (1, 2)]
    return [n for n in names + ["ln_final.hook_scale"] if hook_point(model, n) is not None]


def _run(model, tokens, names, positions, to_cpu, attention_mask, grad, site_positions=None) -> Activations:
    """The pass behind capture and run_with_cache: one hook per name (hook_result on hook_z).
    Attention scores and patterns alone (no gradient) are recomputed from q and k in a hook-free
    pass where the model has one (hooks/patterns.capture_patterns): only the requested layers'
    patterns are materialised, not every layer's. site_positions: {name: positions} overriding
    `positions` for those names."""
    site_positions = dict(site_positions or {})
    if not grad and not site_positions:
        from headscope.hooks.patterns import capture_patterns  # patterns builds on this module's positions

        store = capture_patterns(model, tokens, names, positions, to_cpu, attention_mask)
        if store is not None:
            return store
    store = Activations(model=model)
    moe = {name for name in names if not _NORM_SCALE.match(name) and parse_site(name)[0] == "mlp_post"
           and memories.expert_memories(model, parse_site(name)[1])}  # coefficients computed from the MLP's input
    routed = {name: src for name in names if not _NORM_SCALE.match(name) and hook_point(model, name) is None
              and (src := routed_source(name, ())) is not None}  # router sites computed from the MLP's input

    def make_hook(name: str):
        scale = bool(_NORM_SCALE.match(name))
        kind, layer = (None, None) if scale else parse_site(name)
        dim = 1 if scale else SITES[kind].pos_dim
        flat = not scale and SITES[kind].flat
        where = site_positions.get(name, positions)

        def hook(act: torch.Tensor, hook: Any) -> None:
            if kind in COMPUTED:
                act = head_result(model, layer, act)  # [batch, pos, head, d_model]
            elif name in moe:  # per token: the kept positions of the input [batch, pos, d_model] first
                act = memories.moe_coefficients(model, layer, select_positions(act, where, dim))  # [batch, pos, d_mlp]
            elif name in routed:  # the router as HF's MoE block runs it, on the MLP's input [batch, pos, d_model]
                act = memories.moe_routing(model, layer, select_positions(act, where, dim))[kind]
            elif flat:
                act = act.reshape(*tokens.shape[:2], -1)  # [batch * pos, ...] -> [batch, pos, ...]
            if name not in moe and name not in routed:
                act = select_positions(act, where, dim)
            if not grad:
                act = act.detach()
            store[name] = act.to("cpu") if to_cpu else act

        return hook

    fwd = [(name if _NORM_SCALE.match(name) else f"blocks.{parse_site(name)[1]}.mlp.hook_in" if name in moe
             else routed[name] if name in routed else hook_point_for(name), make_hook(name)) for name in names]
    with torch.set_grad_enabled(grad):
        store.output = model.run_with_hooks(tokens, fwd=fwd, attention_mask=attention_mask)
    if not grad:
        store.output = store.output.detach()
    return store


provide("run_with_cache", run_with_cache)  # model.run_with_cache (models/tl_habits.py) delegates here
