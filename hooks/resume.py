"""Resume a decoder's forward pass at block l from a captured run, skipping blocks 0..l-1.

An edit at block l or later (a patched activation, an ablated head) cannot change the residual
stream into block l, so a sweep of such edits needs blocks l..L-1 only. `capture` records, in
one forward pass, each block's input and the other arguments Hugging Face passed it (causal
mask, rotary tables); `resume` re-enters at block l for any rows of that batch, in any number
and order: the per-row arguments are gathered to the new rows, so stacked copies work too.
Hooks attached with model.hooks fire in the resumed blocks exactly as in a full pass. Two more
savings, both for decoder metrics that read only the last position:
- the last block's MLP runs at the last position only (its input is cut there), and so do the
  final norm and the unembedding; hooks on the last block's MLP side then see one position;
- an edit of block l's per-head z can enter as the attention output o(z'): block l's attention
  is not recomputed (sequential pre-norm blocks).
`supports` checks once per model that resuming reproduces a plain forward pass (and whether the
z shortcut does); models where it does not (encoders, unusual blocks) keep the full pass.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from headscope.hooks.sites import site

HookList = Sequence[tuple[str, Callable[..., Any]]]
_SUPPORT: "weakref.WeakKeyDictionary[Any, tuple[bool, bool]]" = weakref.WeakKeyDictionary()
_CHECK_TOL = 1e-4  # relative to the logits' scale; float32 reordering stays far below this


@dataclass
class Checkpoint:
    """What `capture` recorded for a batch of `rows` prompts."""

    resid: list[torch.Tensor]  # per block: its input [rows, pos, d_model]
    calls: list[tuple[tuple, dict]]  # per block: its other positional arguments and keyword arguments
    logits: torch.Tensor  # [rows, d_vocab] at the last position
    z: dict[int, torch.Tensor]  # block -> z [rows, pos, head, d_head] before the capture's own hooks

    @property
    def rows(self) -> int:
        return self.logits.shape[0]


def _uncached(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call's arguments with any KV cache removed: a resumed block must not append to it."""
    from transformers.cache_utils import Cache

    args = tuple(None if isinstance(v, Cache) else v for v in args)
    kwargs = {k: (None if isinstance(v, Cache) else v) for k, v in kwargs.items()}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return args, kwargs


def capture(model, tokens: torch.Tensor, *, fwd: HookList = (), z_layers: Sequence[int] = (),
            attention_mask: torch.Tensor | None = None) -> Checkpoint:
    """One forward pass of `tokens` [rows, pos] under hooks `fwd`, recording every block's input
    and call arguments, the last-position logits, and z (taken before `fwd` edits it) at z_layers."""
    if model.facts.is_encoder:
        raise ValueError("resume works on decoders only (encoder metrics read every position).")
    n_layers = model.facts.n_layers
    calls: list[Any] = [None] * n_layers
    z: dict[int, torch.Tensor] = {}

    def record(i: int):
        def pre(module, args, kwargs):
            calls[i] = _uncached(args, kwargs)
        return pre

    def keep_z(layer: int):
        def hook(act: torch.Tensor, hook: Any) -> None:
            z[layer] = act.detach()
        return hook

    handles = [b.register_forward_pre_hook(record(i), with_kwargs=True) for i, b in enumerate(model.bridge.blocks)]
    try:
        first = [(site("z", l), keep_z(l)) for l in z_layers]
        with torch.no_grad():
            logits = model.run_with_hooks(tokens, fwd=first + list(fwd), attention_mask=attention_mask)[:, -1]
    finally:
        for h in handles:
            h.remove()
    resid, rest = [], []
    for args, kwargs in calls:
        if args:
            resid.append(args[0])
            rest.append((tuple(args[1:]), kwargs))
        else:
            kwargs = dict(kwargs)
            resid.append(kwargs.pop("hidden_states"))
            rest.append(((), kwargs))
    return Checkpoint(resid=resid, calls=rest, logits=logits, z=z)


def _gather(value: Any, rows: torch.Tensor, n: int) -> Any:
    """Per-row tensors (2+ dims, first dim = the captured batch n) indexed by `rows`; rest as is."""
    if isinstance(value, torch.Tensor):
        return value[rows.to(value.device)] if value.ndim >= 2 and value.shape[0] == n else value
    if isinstance(value, (tuple, list)):
        return type(value)(_gather(v, rows, n) for v in value)
    if isinstance(value, dict):
        return {k: _gather(v, rows, n) for k, v in value.items()}
    return value


def _o_proj(block) -> torch.nn.Module:
    """The attention's output projection (the raw module: calling the bridge would fire hook_z)."""
    o = block.attn.o
    return getattr(o, "original_component", None) or o


def _shortcut_block(block, x: torch.Tensor, z: torch.Tensor, last_only: bool) -> torch.Tensor:
    """A sequential pre-norm block given its heads' z [n, pos, head, d_head] instead of computing attention."""
    h = x + _o_proj(block)(z.flatten(-2))  # [n, pos, d_model] resid_mid
    if last_only:
        h = h[:, -1:]
    return h + block.mlp(block.ln2(h))


def resume(model, ckpt: Checkpoint, start: int, rows: torch.Tensor, *, hidden: torch.Tensor | None = None,
           fwd: HookList = (), z: torch.Tensor | None = None, last_only: bool = True) -> torch.Tensor:
    """Blocks start..L-1 for captured rows `rows` [n] (repeats allowed), then the unembedding.

    hidden: block `start`'s input [n, pos, d_model] (default the captured one). z: block
    `start`'s heads' z [n, pos, head, d_head] to use instead of its attention (needs
    supports(model)[1]; hooks inside block `start` then do not fire). last_only: cut the last
    block to the last position (hooks on its MLP side see [n, 1, ...]). Returns the logits,
    [n, 1, d_vocab] (last_only) or [n, pos, d_vocab].
    """
    blocks = model.bridge.blocks
    n_layers = len(blocks)
    x = ckpt.resid[start][rows] if hidden is None else hidden

    def last_position(module, args):
        return (args[0][:, -1:],) + tuple(args[1:])

    with torch.no_grad(), model.hooks(fwd=fwd):
        for i in range(start, n_layers):
            last = last_only and i == n_layers - 1
            if i == start and z is not None:
                x = _shortcut_block(blocks[i], x, z, last)
                continue
            args, kwargs = _gather(ckpt.calls[i], rows, ckpt.rows)
            # the last block's MLP branch sees the last position only; the residual add broadcasts
            cut = blocks[i].ln2.register_forward_pre_hook(last_position) if last else None
            try:
                out = blocks[i](x, *args, **kwargs)
            finally:
                if cut is not None:
                    cut.remove()
            x = out[0] if isinstance(out, tuple) else out
        if last_only:
            x = x[:, -1:]
        return model.bridge.unembed(model.bridge.ln_final(x))


def supports(model) -> tuple[bool, bool]:
    """(resume reproduces a full pass, the z shortcut reproduces each block), checked once per model
    on a short prompt at every start block, to 1e-4 of the logits' scale."""
    if model in _SUPPORT:
        return _SUPPORT[model]
    ok = shortcut = False
    if not model.facts.is_encoder and hasattr(model.bridge, "blocks"):
        try:
            ok, shortcut = _check(model)
        except Exception:  # an unusual block layout: keep the full pass
            ok = shortcut = False
    _SUPPORT[model] = (ok, shortcut)
    return ok, shortcut


def _check(model) -> tuple[bool, bool]:
    n_layers = model.facts.n_layers
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.facts.d_vocab, (2, 6), generator=gen).to(model.device)
    ckpt = capture(model, tokens, z_layers=range(n_layers))
    scale = 1.0 + ckpt.logits.abs().max().item()
    rows = torch.tensor([1, 0, 1], device=model.device)
    want = ckpt.logits[rows]

    def close(got: torch.Tensor) -> bool:
        return got.shape[-1] == want.shape[-1] and (got[:, -1] - want).abs().max().item() <= _CHECK_TOL * scale

    ok = all(close(resume(model, ckpt, s, rows, last_only=lo)) for s in range(n_layers) for lo in (True, False))
    shortcut = ok and all(
        close(resume(model, ckpt, s, rows, z=ckpt.z[s][rows], last_only=lo))
        for s in range(n_layers) for lo in (True, False)
    )
    return ok, shortcut
