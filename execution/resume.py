"""Resume a decoder's forward pass at block l from a captured run, skipping blocks 0..l-1.

An edit at block l or later (a patched activation, an ablated head) cannot change the residual
stream into block l, so a sweep of such edits needs blocks l..L-1 only. `capture` records, in
one forward pass, each block's input (before its hook_resid_pre) and the other arguments Hugging
Face passed it (causal mask, rotary tables, the KV cache it filled); `resume` re-enters at block
l for any rows of that batch, in any number and order: the per-row arguments are gathered to
the new rows, so stacked copies work too. Hooks passed to `resume` fire in the resumed blocks as
in a full pass, except where a saving below skips them. Savings, all for decoder metrics that
read only the last position:
- the last block's MLP runs at the last position only (its input is cut there), and so do the
  final norm and the unembedding; hooks on the last block's MLP side then see one position;
- an edit of block l's per-head z can enter as the attention output o(z'): block l's attention
  is not recomputed (pre-norm blocks; parallel ones such as GPT-NeoX's add their MLP of the
  block's input);
- an edit that leaves positions before p unchanged runs positions p.. only, attending to the
  captured keys and values before p (`from_pos`);
- blocks no hook looks at run hook-free (fast_blocks: Llama-style, GPT-2, GPT-NeoX, the last
  one attending from the last query only; hf_blocks: the model's own layers elsewhere).
`last_logits` runs a whole pass through the hook-free blocks for a last-position metric,
differentiably, with an optional edit of each block's z.
`supports` checks once per model that resuming reproduces a plain forward pass, and which
savings do (the check itself is execution/resume_check.py); callers keep the full pass where it does
not (encoders, unusual blocks) and while other hooks are attached to the model (an outer hs.ablate or
hs.patch context). A failed check warns once per model (HeadscopeWarning) with what falls back.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from headscope.errors import ConfigError
from headscope.execution import block_shape, fast_blocks, hf_blocks
from headscope.execution.rows import take
from headscope.hooks.kv_states import holds_prefix, new_cache, prefix_cache
from headscope.hooks.sites import site, split_block
from headscope.models.hooked_model import left_padding_starts
from headscope.models.readout import final_readout

HookList = Sequence[tuple[str, Callable[..., Any]]]
_SUPPORT: weakref.WeakKeyDictionary[Any, Support] = weakref.WeakKeyDictionary()
_FAST: weakref.WeakKeyDictionary[Any, list | None] = weakref.WeakKeyDictionary()  # model -> fast_blocks.plan


@dataclass
class Checkpoint:
    """What `capture` recorded for a batch of `rows` prompts."""

    resid: list[torch.Tensor]  # per block: its input [rows, pos, d_model], before its hook_resid_pre
    calls: list[tuple[tuple, dict]]  # per block: its other positional arguments and keyword arguments
    logits: torch.Tensor  # [rows, d_vocab] at the last position
    z: dict[int, torch.Tensor]  # block -> z [rows, pos, head, d_head] before the capture's own hooks
    kv: Any = None  # the Hugging Face cache the pass filled (every block's K and V), if any

    @property
    def rows(self) -> int:
        return self.logits.shape[0]


def _with_cache(args: tuple, kwargs: dict, cache: Any) -> tuple[tuple, dict]:
    """The call's arguments with its KV cache swapped for `cache` (None: a resumed block must not
    append to the captured one)."""
    from transformers.cache_utils import Cache

    args = tuple(cache if isinstance(v, Cache) else v for v in args)
    kwargs = {k: (cache if isinstance(v, Cache) else v) for k, v in kwargs.items()}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = cache is not None
    return args, kwargs


def _cache_of(args: tuple, kwargs: dict) -> Any:
    from transformers.cache_utils import Cache

    return next((v for v in (*args, *kwargs.values()) if isinstance(v, Cache)), None)


def capture(model, tokens: torch.Tensor, *, fwd: HookList = (), z_layers: Sequence[int] = (),
            attention_mask: torch.Tensor | None = None, fast: bool | None = None) -> Checkpoint:
    """One forward pass of `tokens` [rows, pos] under hooks `fwd`, recording every block's input
    (before its hook_resid_pre) and call arguments, the last-position logits, and z (taken
    before `fwd` edits it) at z_layers. attention_mask [rows, pos] (1 = real token): padded rows
    must be left-padded (ConfigError otherwise), so the last position is each row's own; the
    captured per-row arguments (4-d mask, position ids, rotary tables) then follow each row into
    resumed passes. fast: without hooks, run the blocks hook-free (execution/fast_blocks.py; None: when
    supports(model).fast_capture and no hooks are attached)."""
    if model.facts.is_encoder:
        raise ConfigError("resume works on decoders only (encoder metrics read every position).")
    _check_left_padded(attention_mask)
    if fast is None:
        fast = model in _SUPPORT and _SUPPORT[model].fast_capture and model.hook_free()
    if fast and not fwd:
        ckpt = _capture_fast(model, tokens, z_layers, attention_mask)
        if ckpt is not None:
            return ckpt
    n_layers = model.facts.n_layers
    calls: list[Any] = [None] * n_layers
    z: dict[int, torch.Tensor] = {}

    def record(i: int):
        def pre(module, args, kwargs):
            calls[i] = (args, dict(kwargs))
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
    split = [_split_call(args, kwargs) for args, kwargs in calls]
    return Checkpoint(resid=[x for x, _, _ in split], calls=[(args, kwargs) for _, args, kwargs in split],
                      logits=logits, z=z, kv=_cache_of(*calls[0]))


def _check_left_padded(attention_mask: torch.Tensor | None) -> None:
    """The last position is every row's answer position: padded decoder rows must be left-padded."""
    if attention_mask is not None:
        left_padding_starts(attention_mask, attention_mask.shape[0], what="last-position passes read each row's "
                            "answer at the last position")


def _split_call(args: tuple, kwargs: dict) -> tuple[torch.Tensor, tuple, dict]:
    """A block call's (input hidden states, other positional arguments, keyword arguments)."""
    if args:
        return args[0], tuple(args[1:]), kwargs
    kwargs = dict(kwargs)
    return kwargs.pop("hidden_states"), (), kwargs


class _Stop(Exception):
    """Raised by a pre-hook to end a forward pass at block 0 (its arguments are all we need)."""


def _block0_call(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None,
                 forward: Callable[..., Any] | None = None) -> tuple | None:
    """(block 0's input [n, pos, d_model], its other positional arguments, its keyword arguments)
    from a bridge pass stopped there (embedding, mask, rotary tables), or None. forward(tokens,
    attention_mask): the pass to stop (default model(...); the hook-free pass gives the bridge's)."""
    got: list[tuple[tuple, dict]] = []

    def stop(module, args, kwargs):
        got.append((args, dict(kwargs)))
        raise _Stop

    handle = model.bridge.blocks[0].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        if forward is None:
            model(tokens, attention_mask=attention_mask)
        else:
            forward(tokens, attention_mask)
    except _Stop:
        pass
    finally:
        handle.remove()
    return _split_call(*got[0]) if got else None


def _mixed_layers(model) -> bool:
    """Layers of different attention types (config.layer_types: Gemma 2/3's sliding and full
    layers), each called with its own mask and rotary tables."""
    return len(set(getattr(model.bridge.original_model.config, "layer_types", None) or ())) > 1


class _Pass(Exception):
    """Raised by the last block's stand-in to end a pass whose blocks' arguments are all recorded."""


def _block_calls(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None,
                 forward: Callable[..., Any] | None = None) -> tuple[torch.Tensor, list[tuple[tuple, dict]]] | None:
    """(block 0's input [n, pos, d_model], every block's (other positional arguments, keyword
    arguments)) from a bridge pass in which no block runs, or None. Where every layer is of one
    attention type, block 0's arguments stand for all (_block0_call); where they differ (Gemma
    2/3: sliding and full layers, each with its mask and rotary tables), every block's forward is
    replaced for the pass by a stand-in that records its call and hands its input on, the last
    one ending the pass (through model.bridge_forward; `forward` is _block0_call's)."""
    n_layers = model.facts.n_layers
    if not _mixed_layers(model):
        call = _block0_call(model, tokens, attention_mask, forward)
        return None if call is None else (call[0], [(call[1], call[2])] * n_layers)
    blocks = list(model.bridge.blocks)
    got: list[tuple[tuple, dict]] = []

    def stand_in(i: int):
        def run(*args, **kwargs):
            got.append((args, dict(kwargs)))
            if i == len(blocks) - 1:
                raise _Pass
            return _passed_on(*args, **kwargs)
        return run

    # the bridge's own pass: model(...) would try the hook-free pass, which lands here again
    with _standing_in(blocks, stand_in), contextlib.suppress(_Pass):
        model.bridge_forward(tokens, attention_mask=attention_mask)
    if len(got) != len(blocks):
        return None
    split = [_split_call(args, kwargs) for args, kwargs in got]
    return split[0][0], [(args, kwargs) for _, args, kwargs in split]


def _passed_on(*args, **kwargs) -> torch.Tensor:
    """A block call's input hidden states, unchanged (a skipped block's output)."""
    return args[0] if args else kwargs["hidden_states"]


@contextlib.contextmanager
def _standing_in(blocks: Sequence[Any], stand_in: Callable[[int], Callable[..., Any]]):
    """Block i's forward replaced by stand_in(i) for the duration (put back after exceptions too):
    an instance attribute of the bridge block itself (its __setattr__ would pass it on to the
    Hugging Face layer), so the model's own loop calls it with the block's arguments and the
    block's torch pre-hooks still fire. A forward the block already had as an instance attribute
    (e.g. an offloading wrapper) is put back."""
    saved = [vars(block).get("forward") for block in blocks]
    try:
        for i, block in enumerate(blocks):
            object.__setattr__(block, "forward", stand_in(i))
        yield
    finally:
        for block, old in zip(blocks, saved):
            if old is None:
                vars(block).pop("forward", None)
            else:
                object.__setattr__(block, "forward", old)


def record_block(block, x: torch.Tensor, args: tuple, kwargs: dict, cache, layer: int):
    """One hook-free block on x [n, pos, d_model] that also stores its keys and values in `cache`
    (a Hugging Face cache, at `layer`) -> (its output, its z [n, pos, head, d_head]), or None where
    the block does not handle its arguments."""
    out = block.record(x, args, kwargs)
    if out is None:
        return None
    x, z, k, v = out  # k, v [n, kv_head, pos, d_head]
    cache.update(k, v, layer)
    return x, z


def _capture_fast(model, tokens: torch.Tensor, z_layers: Sequence[int],
                  attention_mask: torch.Tensor | None, *, given: Checkpoint | None = None,
                  start: int = 0) -> Checkpoint | None:
    """capture through the hook-free blocks: the bridge runs up to block 0 (embedding, mask,
    rotary tables), then every block runs as plain tensor code, filling a fresh cache. None
    when that does not apply (no plan; a mask the blocks do not handle). Each layer gets its own
    arguments (_block_calls: sliding and full layers their own masks). given, start: the blocks
    from `start` on only, entered with `given`'s input there, its earlier blocks' inputs and keys
    and values kept (the supports check's replay; raises where block 0's input differs)."""
    plans = _fast_plan(model)
    if plans is None:
        return None
    with torch.no_grad():
        got = _block_calls(model, tokens, attention_mask)
        if got is None:
            return None
        x, calls = got
        cache = new_cache(model)
        swapped: dict[int, tuple[tuple, dict]] = {}  # one call object per distinct call (all layers: one)
        for call in calls:
            if id(call) not in swapped:
                swapped[id(call)] = _with_cache(*call, cache)
        calls = [swapped[id(call)] for call in calls]
        resid, z = [], {}
        if given is not None:
            if not torch.allclose(x, given.resid[0].to(x.device)):
                raise AssertionError("block 0's input differs from the bridge's")
            x, resid = given.resid[start], list(given.resid[:start])
            for i in range(start):
                cache.update(given.kv.layers[i].keys, given.kv.layers[i].values, i)
        for i, block in enumerate(plans):
            if i < start:
                continue
            resid.append(x)
            out = record_block(block, x, *calls[i], cache, i)
            if out is None:
                return None
            x, z_i = out
            if i in z_layers:
                z[i] = z_i
        logits = logits_of(model, x[:, -1:])[:, 0]  # [rows, d_vocab]
    return Checkpoint(resid=resid, calls=calls, logits=logits, z=z, kv=cache)


def last_logits(model, tokens: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                edit_z: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor | None:
    """Last-position logits [n, d_vocab] of a forward pass whose blocks run hook-free, each
    block's z [n, q, head, d_head] replaced by edit_z(layer, z) (the last block: the last query
    only, q = 1). Differentiable (gate gradients, L0 training, integrated gradients): less
    arithmetic than a full pass (the last block's last query) and none of the bridge's
    per-block cost. Hooks attached to the model's blocks do not run: callers check
    supports(model).fast_capture, which is False while hooks are attached. None where the
    hook-free blocks do not apply (no plan, unhandled arguments). Padded rows (attention_mask
    [n, pos]) must be left-padded: each row's last token is at the last position, and Hugging
    Face derives its position ids from the mask."""
    _check_left_padded(attention_mask)
    plans = _fast_plan(model)
    got = None if plans is None else _block_calls(model, tokens, attention_mask)
    if got is None:
        return None
    x, calls = got
    for i, block in enumerate(plans):
        edit = None if edit_z is None else (lambda z, i=i: edit_z(i, z))
        x = block.full(x, *_with_cache(*calls[i], None), None, i == len(plans) - 1, edit)
        if x is None:
            return None
    return logits_of(model, x)[:, -1]  # x: [n, 1, d_model]


def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    """Logits [n, q, d_vocab] from the last block's output x [n, q, d_model]: the bridge's final
    norm and unembedding, then the model's final soft-capping where it has one (Gemma 2:
    cap * tanh(logits / cap), as Hugging Face's causal-LM head), after its linear logit scale
    (facts.logit_scale: Granite's 1 / logits_scaling), which the bridge's unembed leaves out."""
    logits = final_readout(model, x)  # final norm (none on post-LN OPT), project_out (OPT-350m), unembedding
    if model.facts.logit_scale != 1.0:
        logits = logits * model.facts.logit_scale
    cap = getattr(model.bridge.original_model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def _gather(value: Any, rows: torch.Tensor, n: int, key: str = "") -> Any:
    """Per-row tensors (2+ dims, first dim = the captured batch n) indexed by `rows`; rest as is. BLOOM's
    `alibi` [n * heads, 1, keys] is per row too, each row's heads together: gathered as [n, heads, 1, keys]
    (review 16c C2: left whole, a 2-row capture's [12, 1, 6] met a 3-row batch)."""
    if isinstance(value, torch.Tensor):
        if key == "alibi" and value.ndim == 3 and value.shape[0] % n == 0 and value.shape[0] > n:
            per_row = value.reshape(n, value.shape[0] // n, *value.shape[1:])  # [n, heads, 1, keys]
            return take(per_row, rows).reshape(-1, *value.shape[1:])  # [len(rows) * heads, 1, keys]
        return take(value, rows) if value.ndim >= 2 and value.shape[0] == n else value
    if isinstance(value, (tuple, list)):
        return type(value)(_gather(v, rows, n) for v in value)
    if isinstance(value, dict):
        return {k: _gather(v, rows, n, k) for k, v in value.items()}
    return value


def _block_call(ckpt: Checkpoint, i: int, rows: torch.Tensor, from_pos: int) -> tuple[tuple, dict]:
    """Block i's captured call arguments for rows `rows`, cut to query positions from_pos.."""
    args, kwargs = _gather(ckpt.calls[i], rows, ckpt.rows)
    if from_pos:
        n_pos = ckpt.resid[i].shape[1]
        args = _suffix(args, from_pos, n_pos)
        kwargs = {k: _suffix(v, from_pos, n_pos, k) for k, v in kwargs.items()}
    return args, kwargs


def _suffix(value: Any, start: int, n_pos: int, key: str = "") -> Any:
    """Per-position arguments cut to query positions start..: cache positions [pos], 4-d masks
    [.., pos, pos] (keys kept whole), position ids [b, pos] and rotary tables [b, pos, d]."""
    if isinstance(value, torch.Tensor):
        if value.ndim == 1 and value.shape[0] == n_pos:
            return value[start:]
        if value.ndim == 4 and value.shape[-2:] == (n_pos, n_pos):
            return value[..., start:, :]
        if key in ("position_ids", "position_embeddings") and value.ndim >= 2 and value.shape[1] == n_pos:
            return value[:, start:]
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_suffix(v, start, n_pos, key) for v in value)
    return value


def _shortcut_block(block, x: torch.Tensor, z: torch.Tensor, last_only: bool,
                    after: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """A block given its heads' z [n, pos, head, d_head] instead of computing attention: the rest
    of the block from its attention output o(z) on, in the block's own shape (block_shape:
    sequential or parallel, pre- or post-norm; the arithmetic the hook-free blocks share). Its
    post-attention norm, resid_mid and MLP hooks fire (unless `after`, the hook-free rest of the
    block, fast_blocks.Block.after, replaces them); resid_pre, attention and resid_post hooks do
    not."""
    if last_only:
        x, z = x[:, -1:], z[:, -1:]
    a = fast_blocks.attention_out(fast_blocks.out_proj(block), z)  # [n, pos, d_model] attention output
    x = x.to(a.device)  # sharded models: the block's device
    if after is not None:
        return after(a, x)
    parts = block_shape.parts(block)
    if parts is None:
        raise ConfigError("this model's blocks have no z shortcut (supports(model).shortcut is False).")
    return block_shape.residual(a, x, parts, in_place=False)


def resume(model, ckpt: Checkpoint, start: int, rows: torch.Tensor, *, hidden: torch.Tensor | None = None,
           fwd: HookList = (), z: torch.Tensor | None = None, last_only: bool = True,
           from_pos: int = 0, fast: bool | None = None) -> torch.Tensor:
    """Blocks start..L-1 for captured rows `rows` [n] (repeats allowed), then the unembedding.

    hidden: block `start`'s input [n, pos, d_model] (default the captured one). z: block
    `start`'s heads' z [n, pos, head, d_head] to use instead of its attention (needs
    supports(model).shortcut; see _shortcut_block for the hooks it skips). last_only: cut the
    last block to the last position (hooks on its MLP side see [n, 1, ...]). from_pos: the
    first position the edit changes; earlier positions are the captured run's, so only
    positions from_pos.. are computed, attending to the captured K and V before them (needs
    supports(model).prefix; hooks then see [n, pos - from_pos, ...]; a sliding-window cache that
    dropped early positions computes every position instead). fast: run blocks no hook
    in `fwd` names through execution/fast_blocks.py (None: when supports(model).fast); with last_only
    the last block then attends from the last query only. Returns the logits, [n, 1, d_vocab]
    (last_only) or [n, pos - from_pos, d_vocab].
    """
    blocks = model.bridge.blocks
    n_layers = len(blocks)
    x = take(ckpt.resid[start], rows) if hidden is None else hidden  # sharded models: per-block devices
    drop = 0  # leading output positions to drop when a from_pos request runs from position 0
    if from_pos:
        if ckpt.kv is None:
            raise ConfigError("resume(from_pos=...) needs a captured KV cache; this model's pass filled none.")
        if not holds_prefix(ckpt.kv, from_pos):
            from_pos, drop = 0, from_pos  # a sliding-window cache kept only recent positions: recompute all
        else:
            x, z = x[:, from_pos:].contiguous(), (None if z is None else z[:, from_pos:].contiguous())
    if fast is None:  # as supports(model) would say (the model's check), while no hook is attached anywhere
        fast = model in _SUPPORT and _SUPPORT[model].fast and model.hook_free()
    plans = _fast_plan(model) if fast else None
    hooked = {block[0] for block in (split_block(name) for name, _ in fwd) if block is not None}
    cache: list[Any] = []  # the captured prefix as a Hugging Face cache, built for the first bridge block

    with torch.no_grad(), (model.hooks(fwd=fwd) if fwd else contextlib.nullcontext()):  # attaching costs ~1 ms
        for i in range(start, n_layers):
            last = last_only and i == n_layers - 1
            if i == start and z is not None:
                x = _shortcut_block(blocks[i], x, z, last, None if plans is None or i in hooked else plans[i].after)
                continue
            args, kwargs = _block_call(ckpt, i, rows, from_pos)
            if plans is not None and i not in hooked:
                out = plans[i].full(x, args, kwargs, fast_blocks.past_kv(ckpt.kv, i, rows, from_pos), last)
                if out is not None:  # None: arguments it does not handle (the bridge block then runs)
                    x = out
                    continue
            x = _bridge_block(model, ckpt, i, x, args, kwargs, rows, from_pos, last, cache)
        x = x[:, -1:] if last_only else x[:, drop:]
        return logits_of(model, x).to(ckpt.logits.device)


def _last_position(module, args):
    return (args[0][:, -1:],) + tuple(args[1:])


def _bridge_block(model, ckpt: Checkpoint, i: int, x: torch.Tensor, args: tuple, kwargs: dict, rows: torch.Tensor,
                  from_pos: int, last: bool, cache: list) -> torch.Tensor:
    """Block i through the bridge (its hooks fire) on x [n, q, d_model] -> [n, q, d_model]; cache:
    the captured prefix as a Hugging Face cache, built here on first use (from_pos). last: the MLP
    branch runs at the last position only (the residual add broadcasts), and a parallel block's
    attention output is cut there too (Falcon adds it into the MLP's output in place)."""
    block = model.bridge.blocks[i]
    if from_pos and not cache:
        cache.append(prefix_cache(model, ckpt.kv, from_pos, rows=rows))
    args, kwargs = _with_cache(args, kwargs, cache[0] if cache else None)
    cuts = []
    if last:
        cuts.append(block_shape.mlp_entry(block).register_forward_pre_hook(_last_position))
        if block_shape.is_parallel(block):
            cuts.append(block.attn.register_forward_hook(lambda module, a, out: block_shape.last_of(out)))
    try:
        out = block(x, *args, **kwargs)
    finally:
        for cut in cuts:
            cut.remove()
    return out[0] if isinstance(out, tuple) else out


def resume_mixed(model, ckpt: Checkpoint, groups: Sequence[tuple[int, torch.Tensor, torch.Tensor]], *,
                 from_pos: int = 0) -> torch.Tensor:
    """Several z-shortcut resumes in one pass: group (start, rows [n_g], z [n_g, pos, head, d_head])
    enters at block `start` as o(z') (see resume), and the running batch grows as the groups
    join, so each block runs once for every row that has reached it instead of once per group.
    Hook-free blocks only (supports(model).fast and .shortcut; no hooks attached), last-position
    metrics. from_pos: as in resume, for every group (a sliding-window cache that dropped early
    positions computes every position instead). Returns [sum n_g, 1, d_vocab] in group order.
    """
    plans = _fast_plan(model)
    if plans is None:  # a caller's bug, not the user's: an internal error
        raise RuntimeError("resume_mixed needs hook-free blocks (supports(model).fast).")
    blocks, n_layers = model.bridge.blocks, model.facts.n_layers
    if from_pos and not holds_prefix(ckpt.kv, from_pos):
        from_pos = 0  # a sliding-window cache kept only recent positions: recompute all
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])
    x, rows, joined = None, None, []  # the running batch [m, q, d_model], its captured rows [m], its groups
    with torch.no_grad():
        for i in range(groups[order[0]][0], n_layers):
            last = i == n_layers - 1
            if x is not None:
                args, kwargs = _block_call(ckpt, i, rows, from_pos)
                out = plans[i].full(x, args, kwargs, fast_blocks.past_kv(ckpt.kv, i, rows, from_pos), last)
                # None: arguments the hook-free block does not handle; the bridge's block runs it instead
                x = out if out is not None else _bridge_block(model, ckpt, i, x, args, kwargs, rows, from_pos, last, [])
            for g in (g for g in order if groups[g][0] == i):
                _, at, z = groups[g]
                enter = take(ckpt.resid[i][:, from_pos:], at)  # [n_g, q, d_model]
                out = _shortcut_block(blocks[i], enter, z[:, from_pos:], last, plans[i].after)
                x = out if x is None else torch.cat([x, out])
                rows = at if rows is None else torch.cat([rows, at])
                joined.append(g)
        logits = logits_of(model, x[:, -1:]).to(ckpt.logits.device)  # [m, 1, d_vocab]
    sizes = [groups[g][1].shape[0] for g in joined]
    parts = dict(zip(joined, logits.split(sizes)))
    return torch.cat([parts[g] for g in range(len(groups))])


def _fast_plan(model) -> list | None:
    """The hook-free blocks: hand-written (fast_blocks) where the architecture has them, else the
    model's own Hugging Face layers (hf_blocks); None where neither applies."""
    if model not in _FAST:
        _FAST[model] = fast_blocks.plan(model) or hf_blocks.plan(model)
    return _FAST[model]


class Support(NamedTuple):
    """What resuming reproduces on a model (see `supports`)."""

    ok: bool  # resume at any block equals a full pass
    shortcut: bool  # a z edit entering as o(z') (pre-norm blocks, sequential or parallel)
    prefix: bool  # from_pos: positions before the edit taken from the captured cache
    fast: bool = False  # hook-free blocks (execution/fast_blocks.py) where no hook looks
    fast_capture: bool = False  # capture without hooks, and last_logits, run the blocks hook-free


def supports(model) -> Support:
    """What resuming reproduces on `model`, checked once per model on short prompts (resumes from
    one block, _check_start; a few start positions) to 1e-4 of the logits' scale in float32. Nothing is
    resumed, checked or remembered while any hook is attached to the model (`model.hook_free()`: a
    hook point's hook, a user's permanent one, or a torch hook on any module of the bridge, which the
    hook-free blocks would not fire): callers then run full passes, where every hook fires. A check that fails
    (rather than one that does not apply, e.g. hook-free blocks on an unknown architecture) is
    said once per model, as a HeadscopeWarning naming the model and what runs instead."""
    if not model.hook_free():
        return Support(False, False, False)
    if model in _SUPPORT:
        return _SUPPORT[model]
    found = Support(False, False, False)
    if not model.facts.is_encoder and hasattr(model.bridge, "blocks"):
        from headscope.execution.resume_check import _check  # the check resumes passes: it imports this module

        found = _check(model)
    _SUPPORT[model] = found
    return found
