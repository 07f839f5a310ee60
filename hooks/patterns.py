"""Attention patterns on demand: recomputed from a layer's q and k, for the heads and queries asked for.

A pass through the TransformerBridge materialises every layer's [batch, head, q, k] pattern, the
largest activation of a long prompt, even when one head of one layer is wanted. Where the hook-free
blocks run a model's pass (execution.hook_free: the hand-written blocks, else the model's own
layers, any dtype), the pass runs the fused attention kernel and the requested patterns are
recomputed from the layer's post-rotary q and k, its mask (causal, padding, sliding window), scale
and score soft-cap (Gemma 2), with grouped KV heads mapped to their query heads, a chunk of queries
at a time: memory is the requested pattern plus one chunk's scores. `attention_pattern` stops the
pass at the layer; `capture` and `run_with_cache` take this route when only patterns and scores
are requested (no hook attached) in float32, running the rest of the pass for its output. Elsewhere
(hooks attached, a model whose hook-free pass does not apply, capture in half precision) the
bridge's own pattern is read, which is exact but not memory-light. Scores are computed in the
dtype the model's attention uses (`scores_in_float32`: GPT-J upcasts q and k). In half precision the
fused kernel's rounding of earlier layers moves later layers' q and k, so `attention_pattern` and
`reduce_patterns` equal Hugging Face eager's bfloat16 pattern at layer 0 only: later layers are a few
bfloat16 steps off it (review 15b verify C1, a 3-layer GPT-J: 0.0078 and 0.0156 at layers 1-2, up to 0.025
on other prompts), as far from the float32 pattern as Hugging Face's own bfloat16 one is (tests/analyses/
test_gptj.py holds them within 1.5 times that gap). `capture` / `run_with_cache` give the bridge's pattern, which in
half precision runs the model's own LayerNorms (models/loading.py, review 16c A3: its Python norm was a bfloat16 step
off, 0.031 at BLOOM's layer 2 on padded rows); then BLOOM's and GPT-2's equal Hugging Face eager bfloat16 exactly on a
padded batch, but the bridge's own attention recomputation can still round one step apart (GPT-NeoX, a 2-layer test
model: 6e-5 at layer 1 on 1 of 8 padded rows, its residual stream and logits exact).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from headscope.hooks.cache import Activations
from headscope.hooks.capture import Positions, position_index
from headscope.hooks.edits import require_edits
from headscope.hooks.sites import site
from headscope.models.hooked_model import hook_free_pass

DEFAULT_CHUNK = 256  # queries per chunk: [batch, heads, 256, keys] scores at a time
_ATTENTION_SITE = re.compile(r"^blocks\.(\d+)\.attn\.hook_(attn_scores|pattern)$")
_KIND = {"attn_scores": "scores", "pattern": "pattern"}
# Hugging Face attentions that compute q k^T (and the softmax) in float32 from half-precision q and k (their
# eager code upcasts: GPTJ/CodeGen/GPT-Neo `query.to(torch.float32)`); TransformerLens runs these
# through its plain AttentionBridge, i.e. Hugging Face's own attention (review 15b A2)
FLOAT32_SCORES = ("GPTJForCausalLM", "CodeGenForCausalLM", "GPTNeoForCausalLM")


def scores_in_float32(model) -> bool:
    """Whether the model's attention computes its scores in float32 whatever its dtype (FLOAT32_SCORES, or
    GPT-2's reorder_and_upcast_attn); elsewhere scores are in the model's dtype and the softmax in float32
    (Llama's, NeoX's eager `softmax(..., dtype=torch.float32)`; GPT-2's softmax in bfloat16 rounds the same,
    as torch's half-precision softmax accumulates in float32), cast back to the model's dtype."""
    if model.facts.architecture in FLOAT32_SCORES:
        return True
    attn = model.bridge.blocks[0].attn if len(model.bridge.blocks) else None
    return bool(getattr(attn, "_reorder_and_upcast_attn", False))


def attention_pattern(model, tokens: torch.Tensor, layer: int, heads: int | Sequence[int] | None = None,
                      query_positions: Positions = None, *, attention_mask: torch.Tensor | None = None,
                      chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Attention weights of `layer` [batch, n_heads asked, n_queries, n_keys] for tokens [batch, pos].

    heads: None (all), an int (the axis kept, length 1) or a list; query_positions: as capture's
    positions (None = all; negatives count from the end). attention_mask [batch, pos] (1 = real
    token), as for the model. Equal to the bridge's hook_pattern restricted to those heads and
    queries (Hugging Face's eager attention weights), detached. Where the hook-free blocks apply
    (see the module docstring) no block after `layer` runs and the pattern is recomputed from q
    and k, `chunk` queries at a time; elsewhere the bridge's pass runs up to `layer` and its
    pattern is cut, so every earlier layer's pattern is materialised on the way.
    """
    tokens = model.check_tokens(tokens)
    model.check_layer(layer)
    if attention_mask is not None:
        attention_mask = attention_mask.to(model.device)
    head_idx = _head_index(model, layer, heads, tokens.device)  # [h']
    query_idx = position_index(query_positions, tokens.shape[1], tokens.device)  # [q']
    got: dict[str, torch.Tensor] = {}
    upcast = scores_in_float32(model)

    def keep(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float,
             softcap: float | None = None) -> None:
        got.update(attention_weights(q, k, mask, scale, head_idx, query_idx, chunk=chunk, softcap=softcap,
                                     upcast=upcast))

    with torch.no_grad():
        if hook_free_pass(model, tokens, attention_mask, attention={layer: keep}, stop_after=layer) is not None:
            return got["pattern"]
        return _bridge_pattern(model, tokens, attention_mask, layer, head_idx, query_idx)


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float, heads: torch.Tensor,
                      queries: torch.Tensor, *, chunk: int = DEFAULT_CHUNK, kinds: Iterable[str] = ("pattern",),
                      softcap: float | None = None, upcast: bool = False) -> dict[str, torch.Tensor]:
    """Eager attention of some heads and queries: {"scores": q k^T scale (soft-capped) + mask, "pattern": its
    softmax}, each [n, h', q', keys] in q's dtype, for the kinds asked (arguments as `score_chunks`). The only
    scores held beyond the results are one chunk's [n, h', chunk, keys]."""
    n_keys = k.shape[2]
    out = {kind: q.new_empty(q.shape[0], heads.numel(), queries.numel(), n_keys)
           for kind in ("scores", "pattern") if kind in kinds}
    for rows, s in score_chunks(q, k, mask, scale, heads, queries, chunk=chunk, softcap=softcap, upcast=upcast):
        if "scores" in out:
            out["scores"][:, :, rows] = s
        if "pattern" in out:
            out["pattern"][:, :, rows] = torch.softmax(s, dim=-1, dtype=torch.float32)
    return out


def score_chunks(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float, heads: torch.Tensor,
                 queries: torch.Tensor, *, chunk: int = DEFAULT_CHUNK,
                 softcap: float | None = None, upcast: bool = False) -> Iterator[tuple[slice, torch.Tensor]]:
    """Eager attention scores q k^T scale + mask of some heads and queries, `chunk` queries at a
    time: (slice of `queries`, scores [n, h', c, keys]). q [n, head, pos, d_head] and k
    [n, kv_head, keys, d_head] after rotary (query head h reads KV head h // (head / kv_head));
    mask [n or 1, 1, pos, keys] additive or bool (False = masked, filled with the dtype's minimum,
    as Hugging Face's masks), or None for causal with queries at the last positions of the keys;
    heads [h'] and queries [q'] index tensors. softcap: scores soft-capped before the mask,
    cap * tanh(scores / cap), as Gemma 2's eager attention. upcast: q and k in float32 first, the scores
    then in float32 (`scores_in_float32`: the model's own attention does so)."""
    if upcast:
        q, k = q.float(), k.float()
    n_pos, n_keys = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    q = q.index_select(1, heads)  # [n, h', pos, d_head]
    kt = k.index_select(1, torch.div(heads, group, rounding_mode="floor")).transpose(-1, -2)  # [n, h', d_head, keys]
    for start in range(0, queries.numel(), max(1, chunk)):
        idx = queries[start:start + chunk]  # [c]
        s = torch.matmul(q.index_select(2, idx), kt).mul_(scale)  # [n, h', c, keys]
        if softcap is not None:
            s = torch.tanh(s.div_(softcap)).mul_(softcap)
        if mask is None:  # causal: query position p (of n_pos, ending at the last key) sees keys up to p
            allowed = torch.arange(n_keys, device=s.device) <= (idx + n_keys - n_pos)[:, None]  # [c, keys]
            s = s.masked_fill_(~allowed, torch.finfo(s.dtype).min)
        elif mask.dtype == torch.bool:
            s = s.masked_fill_(~mask.index_select(2, idx), torch.finfo(s.dtype).min)
        else:
            s = s.add_(mask.index_select(2, idx))  # [n or 1, 1, c, keys] additive
        yield slice(start, start + idx.numel()), s


# (layer, query positions [c], attention weights [batch, head, c, keys] of those queries) -> None
PatternReducer = Callable[[int, torch.Tensor, torch.Tensor], None]


def reduce_patterns(model, tokens: torch.Tensor, reduce: PatternReducer, *, layers: Sequence[int] | None = None,
                    query_positions: Positions = None, attention_mask: torch.Tensor | None = None,
                    keep: torch.Tensor | None = None, logits_from: int = 0,
                    chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """One forward pass of tokens [batch, pos] that hands every requested layer's attention weights
    (every head; the queries `query_positions`, as capture's positions) to `reduce`, which keeps
    what it needs (a sum, one row) and nothing else: where the hook-free blocks apply, a chunk of
    queries at a time recomputed from q and k (memory linear in the length: one chunk's scores),
    else once per layer from the bridge's hook_pattern. keep: bool [pos, pos] restricting every
    layer's attention besides the model's mask (as hook_free_pass; through the bridge, scores the
    mask hides are set to the dtype's minimum at hook_attn_scores). Returns the logits
    [batch, pos - logits_from, d_vocab]."""
    tokens = model.check_tokens(tokens)
    if attention_mask is not None:
        attention_mask = attention_mask.to(model.device)
    layers = range(model.facts.n_layers) if layers is None else list(layers)
    for layer in layers:
        model.check_layer(layer)
    heads = torch.arange(model.facts.n_heads, device=tokens.device)
    query_idx = position_index(query_positions, tokens.shape[1], tokens.device)  # [q']
    upcast = scores_in_float32(model)

    def at(layer: int):
        def run(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float,
                softcap: float | None = None) -> None:
            for rows, s in score_chunks(q, k, mask, scale, heads, query_idx, chunk=chunk, softcap=softcap,
                                        upcast=upcast):
                reduce(layer, query_idx[rows], torch.softmax(s, dim=-1, dtype=torch.float32))
        return run

    with torch.no_grad():
        out = hook_free_pass(model, tokens, attention_mask, attention={layer: at(layer) for layer in layers},
                             keep=keep, logits_from=logits_from)
        if out is not None:
            return out

        def take(layer: int):
            def hook(pattern: torch.Tensor, hook) -> None:  # [batch, head, q, keys]
                reduce(layer, query_idx, pattern.index_select(2, query_idx.to(pattern.device)))
            return hook

        fwd = [(site("pattern", layer), take(layer)) for layer in layers]
        if keep is not None:
            require_edits(model, "a keep mask on attention (hook_attn_scores)")  # review 16d A6
            fwd += [(site("scores", layer), _keep_hook(keep)) for layer in range(model.facts.n_layers)]
        kw = {} if attention_mask is None else {"attention_mask": attention_mask}
        with model.hooks(fwd=fwd):
            return model(tokens, **kw)[:, logits_from:]


def keep_scores(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Attention scores [batch, head, q, k] with the keys `keep` ([q, k] or [n or 1, 1, q, k] bool)
    does not allow set to the dtype's minimum (what a hook_attn_scores hook returns to hide them)."""
    allowed = keep.to(scores.device).bool()
    allowed = allowed[None, None] if allowed.ndim == 2 else allowed
    return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)


def _keep_hook(keep: torch.Tensor):
    """A hook_attn_scores hook applying keep_scores with a fixed `keep`."""
    return lambda scores, hook: keep_scores(scores, keep)


def capture_patterns(model, tokens: torch.Tensor, names: Sequence[str], positions: Positions, to_cpu: bool,
                     attention_mask: torch.Tensor | None) -> Activations | None:
    """capture's route when only attention scores and patterns are requested (no gradient): one
    hook-free pass whose output is the model's, the requested layers' scores and patterns (every
    head; `positions` selects queries) recomputed from q and k on the way, as the bridge's hooks
    would store them. None where the hook-free pass does not apply (capture then runs the bridge), and in
    half precision: the hook-free blocks run the fused kernel, whose bfloat16 rounding differs from the eager
    attention the bridge runs (and Hugging Face's output_attentions), so from layer 1 on q and k, and the
    patterns, would differ from the model's own by several rounding steps (review 15b A2: 0.031)."""
    if model.dtype in (torch.float16, torch.bfloat16):
        return None
    wanted: dict[int, set[str]] = {}
    for name in names:
        match = _ATTENTION_SITE.match(name)
        if match is None:
            return None
        wanted.setdefault(int(match.group(1)), set()).add(_KIND[match.group(2)])
    tokens = model.check_tokens(tokens)
    if attention_mask is not None:
        attention_mask = attention_mask.to(model.device)
    heads = torch.arange(model.facts.n_heads, device=tokens.device)
    query_idx = position_index(positions, tokens.shape[1], tokens.device)
    store = Activations(model=model)
    upcast = scores_in_float32(model)

    def at(layer: int):
        def keep(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float,
                 softcap: float | None = None) -> None:
            got = attention_weights(q, k, mask, scale, heads, query_idx, kinds=wanted[layer], softcap=softcap,
                                    upcast=upcast)
            for kind in ("scores", "pattern"):  # the bridge's order: hook_attn_scores fires first
                if kind in got:
                    store[site(kind, layer)] = got[kind].to("cpu") if to_cpu else got[kind]
        return keep

    with torch.no_grad():
        output = hook_free_pass(model, tokens, attention_mask, attention={layer: at(layer) for layer in sorted(wanted)})
    if output is None:
        return None
    store.output = output
    return store


class _Got(Exception):
    """Raised by the pattern hook to end the bridge's pass once the layer's pattern is taken."""


def _bridge_pattern(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None, layer: int,
                    heads: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """The bridge's own hook_pattern of `layer` [batch, h', q', keys], cut inside the hook; the pass
    stops there."""
    got: list[torch.Tensor] = []

    def take(pattern: torch.Tensor, hook) -> None:  # pattern [batch, head, q, keys]
        got.append(pattern.index_select(1, heads.to(pattern.device)).index_select(2, queries.to(pattern.device)))
        raise _Got

    with model.hooks(fwd=[(site("pattern", layer), take)]):
        try:
            model(tokens, attention_mask=attention_mask)
        except _Got:
            pass
    return got[0]


def _head_index(model, layer: int, heads: int | Sequence[int] | None, device: torch.device) -> torch.Tensor:
    """heads (None = all) as an index tensor [h'], each checked against the model."""
    if heads is None:
        return torch.arange(model.facts.n_heads, device=device)
    chosen = [heads] if isinstance(heads, int) else list(heads)
    for head in chosen:
        model.check_head(layer, head)
    return torch.tensor(chosen, dtype=torch.long, device=device)
