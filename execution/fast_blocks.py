"""Hook-free decoder blocks for resumed passes: the same arithmetic as a block, without the bridge.

A resumed pass (execution/resume.py) often runs blocks that no hook looks at: every block after an
ablated head or a patched activation. Through the TransformerBridge each such block costs about
a millisecond of Python (hook points, wrappers) besides its arithmetic, which dominates the
small passes of a patching sweep. `plan` returns, for an architecture it knows, a `Block` per
block computing the same thing from the block's own weight modules (read live, so in-place
weight edits are seen): the whole block, the rest of it after its attention output (when a z
edit enters as the attention output) and the block with its z, keys and values (for a
hook-free capture). One saving a bridge block cannot make: in the last block the attention of
the last query only (`last_query`), since a last-position metric reads nothing else. `full`
also takes an edit of the heads' z and is differentiable, which gives resume.last_logits (gate
gradients, L0 training, gradient attribution). resume.supports checks each use against a full
pass before anything relies on it. The residual sums after attention (`residual`) and the
output projection (`out_proj`, `attention_out`) are also what resume's z shortcut runs through
the bridge's own norm and MLP, so both paths share one copy of that arithmetic.

Known, in float32: Llama-style blocks (pre-norm RMSNorm, rotary q/k, grouped KV heads, gated
MLP), i.e. Llama, Mistral and Qwen2 layers; GPT-2 blocks; and GPT-NeoX (Pythia) blocks, parallel
residual and partial rotary. Others (and half precision, where Hugging Face's eager attention
rounds differently) get None: their own Hugging Face layers run hook-free instead (hf_blocks).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from headscope.execution import block_shape
from headscope.execution.rows import take

# x [n, q, d_model], the block's call arguments and kwargs (gathered to the rows and cut to the
# query positions), the captured keys and values before them ([n, kv_head, p, d_head] each, or
# None), last_query, and optionally an edit of the heads' z ([n, q or 1, head, d_head] -> same)
# -> [n, q or 1, d_model], or None for arguments it does not handle
ZEdit = Callable[[torch.Tensor], torch.Tensor]
FastBlock = Callable[..., "torch.Tensor | None"]
LLAMA_LIKE = {"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"}
# queries x keys per head up to which plain matmul-softmax attention beats the fused kernel:
# EAGER_SCORES on one CPU thread and on other devices; EAGER_SCORES_THREADED on several CPU
# threads, where the fused CPU kernel barely gains from a second thread and matmul-softmax
# nearly halves (measured at 16 and 64 dims per head, 2 threads)
EAGER_SCORES, EAGER_SCORES_THREADED = 400, 2304


class Block(NamedTuple):
    """One block, hook-free: `full` as FastBlock; `after(a, x)` = the block's output from its
    attention output a (a fresh buffer, added to in place) and its input x (the z shortcut);
    `record(x, args, kwargs)` = the block from position 0 with its z, keys and values (for capture);
    `qk(x, args, kwargs)` = its attention's inputs (patterns recomputed on demand, hooks/patterns)."""

    full: FastBlock
    after: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    record: Callable[[torch.Tensor, tuple, dict], Any]
    qk: Callable[[torch.Tensor, tuple, dict], Any] | None = None


_raw = block_shape.raw


def plan(model) -> list[Block] | None:
    """The hook-free blocks, or None when the architecture (or dtype) is not a known one."""
    layers = [_raw(b) for b in model.bridge.blocks]
    kinds = {type(layer).__name__ for layer in layers}
    build = (_llama_block if kinds <= LLAMA_LIKE else _gpt2_block if kinds == {"GPT2Block"}
             else _neox_block if kinds == {"GPTNeoXLayer"} else None)
    if not layers or build is None:
        return None
    if any(p.dtype != torch.float32 for p in model.bridge.parameters()):
        return None  # half precision: HF's eager attention rounds differently (softmax in float32)
    try:
        out = [build(layer, out_proj(block), block_shape.is_parallel(block))
               for layer, block in zip(layers, model.bridge.blocks)]
    except AttributeError:  # a variant without the expected modules
        return None
    return None if any(b is None for b in out) else out  # None: a variant the builder cannot run


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """LlamaRMSNorm: normalised in float32, scaled in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon))
    return norm.weight * h.to(x.dtype)


def _rotate_part(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of the first cos.shape[-1] dimensions of x [n, head, q, d_head] (partial
    rotary, as GPT-NeoX), the rest passed through."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return _rotate(x, cos, sin)
    return torch.cat((_rotate(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin for x [n, head, q, d_head], cos/sin [n or 1, q, d_head],
    computed half by half (rotate_half(x) = [-x2, x1]) to spare the temporaries."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    first = x1 * cos[..., :half] - x2 * sin[..., :half]
    second = x2 * cos[..., half:] + x1 * sin[..., half:]
    return torch.cat((first, second), dim=-1)


def _eager_limit(device: torch.device) -> int:
    """Scores per head up to which _eager_attention runs (see EAGER_SCORES)."""
    threaded = device.type == "cpu" and torch.get_num_threads() > 1
    return EAGER_SCORES_THREADED if threaded else EAGER_SCORES


def _eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T scale + mask) v with grouped KV heads, for few scores per head (a resumed
    pass's last positions, short prompts), where it beats the fused kernel (see _eager_limit).
    q [n, head, q, d_head]; k, v [n, kv, keys, d_head]; mask [n or 1, 1, q, keys] additive or
    bool. -> [n, head, q, d_head]."""
    n, n_heads, q_len, d_head = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv  # query heads h share KV head h // group
    s = torch.matmul(q.reshape(n, n_kv, group * q_len, d_head), k.transpose(-1, -2)).mul_(scale)
    s = s.view(n, n_kv, group, q_len, -1)  # [n, kv, group, q, keys]
    if mask.dtype == torch.bool:
        s = s.masked_fill_(~mask.unsqueeze(1), torch.finfo(s.dtype).min)
    else:
        s = s.add_(mask.unsqueeze(1))
    p = torch.softmax(s, dim=-1).view(n, n_kv, group * q_len, -1)
    return torch.matmul(p, v).view(n, n_heads, q_len, d_head)


def _llama_block(layer: torch.nn.Module, o_proj: torch.nn.Module, parallel: bool) -> Block | None:
    """Pre-norm RMSNorm, separate q/k/v projections with rotary tables, gated MLP; None for
    projection sizes that are not whole heads."""
    attn, mlp = _raw(layer.self_attn), _raw(layer.mlp)
    ln1, ln2 = _raw(layer.input_layernorm), _raw(layer.post_attention_layernorm)
    q_proj, k_proj, v_proj = (_raw(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj"))
    gate, up, down, act = _raw(mlp.gate_proj), _raw(mlp.up_proj), _raw(mlp.down_proj), mlp.act_fn
    d_head = int(attn.head_dim)
    n_heads, n_kv = q_proj.out_features // d_head, k_proj.out_features // d_head
    if n_heads * d_head != q_proj.out_features or n_kv * d_head != k_proj.out_features:
        return None

    def project(h: torch.Tensor, args: tuple, kwargs: dict, last_query: bool):
        n, q_len, _ = h.shape
        cos, sin = kwargs["position_embeddings"]  # [n or 1, q, d_head]
        if cos.shape[-1] != d_head:
            return None  # partial rotary embeddings: the bridge's block runs
        k = _rotate(k_proj(h).view(n, q_len, n_kv, d_head).transpose(1, 2), cos, sin)  # [n, kv, q, d_head]
        v = v_proj(h).view(n, q_len, n_kv, d_head).transpose(1, 2)
        if last_query:
            h, cos, sin = h[:, -1:], cos[:, -1:], sin[:, -1:]
        q = _rotate(q_proj(h).view(n, h.shape[1], n_heads, d_head).transpose(1, 2), cos, sin)  # [n, head, q', d_head]
        return q, k, v

    return _block(ln1=lambda x: _rms_norm(x, ln1), ln2=lambda x: _rms_norm(x, ln2), project=project,
                  o_proj=o_proj, mlp=lambda h: down(act(gate(h)).mul_(up(h))),
                  mask_of=lambda args, kwargs: kwargs.get("attention_mask"),
                  shape=(n_heads, n_kv, d_head), scaling=float(attn.scaling), parallel=parallel)


def _gpt2_block(layer: torch.nn.Module, o_proj: torch.nn.Module, parallel: bool) -> Block | None:
    """Pre-norm LayerNorm, one fused q/k/v projection (Conv1D), learned positions (in the
    embedding), plain MLP; attention mask passed positionally. None for cross-attention blocks."""
    attn, mlp = _raw(layer.attn), _raw(layer.mlp)
    if getattr(attn, "is_cross_attention", False) or hasattr(layer, "crossattention"):
        return None
    c_attn, c_fc, c_proj, act = _raw(attn.c_attn), _raw(mlp.c_fc), _raw(mlp.c_proj), mlp.act
    n_heads, d_head = int(attn.num_heads), int(attn.head_dim)
    d_model = n_heads * d_head

    def project(h: torch.Tensor, args: tuple, kwargs: dict, last_query: bool):
        n, q_len, _ = h.shape
        q, k, v = c_attn(h).split(d_model, dim=2)  # [n, q, d_model] each
        k = k.view(n, q_len, n_heads, d_head).transpose(1, 2)  # [n, head, q, d_head]
        v = v.view(n, q_len, n_heads, d_head).transpose(1, 2)
        q = q[:, -1:] if last_query else q
        return q.reshape(n, q.shape[1], n_heads, d_head).transpose(1, 2), k, v

    def mask_of(args: tuple, kwargs: dict):  # forward(hidden, cache, attention_mask, encoder_hidden_states, ...)
        if (args[2] if len(args) > 2 else kwargs.get("encoder_hidden_states")) is not None:
            return _UNHANDLED
        return args[1] if len(args) > 1 else kwargs.get("attention_mask")

    return _block(ln1=_raw(layer.ln_1), ln2=_raw(layer.ln_2), project=project, o_proj=o_proj,
                  mlp=lambda h: c_proj(act(c_fc(h))), mask_of=mask_of, shape=(n_heads, n_heads, d_head),
                  scaling=float(attn.scaling), parallel=parallel)


def _neox_block(layer: torch.nn.Module, o_proj: torch.nn.Module, parallel: bool) -> Block:
    """GPT-NeoX (Pythia): pre-norm LayerNorms, one fused q/k/v projection laid out per head,
    partial rotary, GELU MLP; parallel residual x + attention(ln1(x)) + MLP(ln2(x)) where the
    bridge's block is parallel (block_shape)."""
    attn, mlp = _raw(layer.attention), _raw(layer.mlp)
    qkv, fc, proj, act = _raw(attn.query_key_value), _raw(mlp.dense_h_to_4h), _raw(mlp.dense_4h_to_h), mlp.act
    d_head = int(attn.head_size)
    n_heads = qkv.out_features // (3 * d_head)

    def project(h: torch.Tensor, args: tuple, kwargs: dict, last_query: bool):
        n, q_len, _ = h.shape
        cos, sin = kwargs["position_embeddings"]  # [n or 1, q, rotary dims] (odd rotary_ndims: rounded up, as HF)
        if cos.shape[-1] > d_head:
            return None  # an unexpected rotary table width: the bridge's block runs
        q, k, v = qkv(h).view(n, q_len, n_heads, 3 * d_head).transpose(1, 2).chunk(3, dim=-1)  # [n, head, q, d_head]
        k = _rotate_part(k, cos, sin)
        if last_query:
            q, cos, sin = q[:, :, -1:], cos[:, -1:], sin[:, -1:]
        return _rotate_part(q, cos, sin), k, v

    return _block(ln1=_raw(layer.input_layernorm), ln2=_raw(layer.post_attention_layernorm), project=project,
                  o_proj=o_proj, mlp=lambda h: proj(act(fc(h))),
                  mask_of=lambda args, kwargs: kwargs.get("attention_mask"), shape=(n_heads, n_heads, d_head),
                  scaling=float(attn.scaling), parallel=parallel)


_UNHANDLED = object()  # mask_of's answer for call arguments the hook-free blocks do not handle


def _block(*, ln1: Callable, ln2: Callable, project: Callable, o_proj: Callable, mlp: Callable, mask_of: Callable,
           shape: tuple[int, int, int], scaling: float, parallel: bool = False) -> Block:
    """A pre-norm block from its parts: attention o(attention(ln1(x))), then the residual sums
    and the MLP (`residual`: sequential or parallel). project(h, args, kwargs, last_query) -> q
    [n, head, q', d_head], k and v [n, kv, q, d_head], or None for arguments it does not handle
    (the block then answers None: the bridge's block runs)."""
    n_heads, n_kv, d_head = shape
    parts = block_shape.Parts(mlp=mlp, ln2=ln2, parallel=parallel)

    def handled_mask(args: tuple, kwargs: dict):
        """The block's 4-d mask, None (causal), or _UNHANDLED: e.g. a 2-d padding mask or a block
        mask (other attention backends), the bridge's job."""
        mask = mask_of(args, kwargs)
        if mask is not None and mask is not _UNHANDLED and not (isinstance(mask, torch.Tensor) and mask.ndim == 4):
            return _UNHANDLED
        return mask

    def attend(x: torch.Tensor, args: tuple, kwargs: dict, past: tuple[torch.Tensor, torch.Tensor] | None,
               last_query: bool):
        """-> (z [n, q', head * d_head], this call's k and v [n, kv, q, d_head]) or None (unhandled)."""
        mask = handled_mask(args, kwargs)  # [n or 1, 1, q, keys] additive or bool, or None
        if mask is _UNHANDLED:
            return None
        projected = project(ln1(x), args, kwargs, last_query)
        if projected is None:
            return None
        q, k_new, v_new = projected
        k, v = k_new, v_new
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # [n, kv, keys, d_head]
        if last_query and mask is not None:
            mask = mask[..., -1:, :]
        if mask is None and q.shape[2] == k.shape[2] and q.shape[2] * k.shape[2] > _eager_limit(q.device):
            # causal from position 0 (execution.hook_free drops a mask that says only that): the fused
            # kernel's causal mode skips the blocks above the diagonal, as Hugging Face's SDPA pass
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=n_heads != n_kv)
            return a.transpose(1, 2).reshape(x.shape[0], -1, n_heads * d_head), k_new, v_new  # [n, q, head * d_head]
        if mask is None:  # causal: the queries are the last positions of the keys
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - q.shape[2])
            mask = mask[None, None]  # [1, 1, q', keys]
        if q.shape[2] * k.shape[2] <= _eager_limit(q.device):
            a = _eager_attention(q, k, v, mask, scaling)  # [n, head, q', d_head]
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype) if mask.is_floating_point() else mask,
                                               scale=scaling, enable_gqa=n_heads != n_kv)  # [n, head, q', d_head]
        return a.transpose(1, 2).reshape(x.shape[0], -1, n_heads * d_head), k_new, v_new

    def run(x: torch.Tensor, args: tuple, kwargs: dict, past: tuple[torch.Tensor, torch.Tensor] | None,
            last_query: bool, edit_z: ZEdit | None = None) -> torch.Tensor | None:
        got = attend(x, args, kwargs, past, last_query)
        if got is None:
            return None
        z = got[0]  # [n, q', head * d_head]
        if edit_z is not None:
            z = edit_z(z.view(*z.shape[:2], n_heads, d_head)).flatten(2)
        x = x[:, -1:] if last_query else x
        return after(attention_out(o_proj, z), x)

    def record(x: torch.Tensor, args: tuple, kwargs: dict):
        """The block with its parts: (output [n, q, d_model], z [n, q, head, d_head], k, v
        [n, kv, q, d_head]), or None (unhandled arguments)."""
        got = attend(x, args, kwargs, None, False)
        if got is None:
            return None
        z, k, v = got
        return after(attention_out(o_proj, z), x), z.view(*z.shape[:2], n_heads, d_head), k, v

    def after(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The block's output [n, q, d_model] from its attention output a (a fresh buffer: added
        to in place) and its input x (see residual)."""
        return block_shape.residual(a, x, parts, in_place=True)

    def qk(x: torch.Tensor, args: tuple, kwargs: dict):
        """The attention's inputs from position 0: (q [n, head, q, d_head], k [n, kv, q, d_head],
        both after rotary, the block's mask [n or 1, 1, q, q] additive or bool, or None for causal,
        the scale and the score soft-cap, None here), or None (unhandled arguments).
        softmax(q k^T scale + mask) is the pattern."""
        mask = handled_mask(args, kwargs)
        if mask is _UNHANDLED:
            return None
        projected = project(ln1(x), args, kwargs, False)
        if projected is None:
            return None
        q, k, _ = projected
        return q, k, mask, scaling, None

    return Block(run, after, record, qk)


def out_proj(block: torch.nn.Module) -> torch.nn.Module:
    """A bridge block's attention output projection, the raw Hugging Face module (calling the
    bridge's would fire hook_z)."""
    return _raw(block.attn.o)


def attention_out(o_proj: Callable, z: torch.Tensor) -> torch.Tensor:
    """The attention output o(z) [n, q, d_model] from the heads' z [n, q, head, d_head] (or
    already flattened to [n, q, head * d_head]); contiguous, as GPT-2's Conv1D views its input."""
    return o_proj(z.flatten(2).contiguous())


def past_kv(cache: Any, layer: int, rows: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Captured keys and values of positions [0, length) of `layer` for batch rows `rows` [n]."""
    if not length:
        return None
    lay = cache.layers[layer]
    return take(lay.keys[:, :, :length], rows), take(lay.values[:, :, :length], rows)  # [n, kv_head, length, d_head]
