"""More of TransformerLens's ActivationCache habits, as a mixin of Activations (hooks/cache.py).

`logit_attrs`, `get_full_resid_decomposition`, `stack_activation` and `remove_batch_dim` follow
transformer_lens/ActivationCache.py (4.3), plus the two things every residual helper shares here:
TransformerLens's slices (`slice_axis`: pos_slice / batch_slice as int, tuple, slice, list or
tensor) and the weight of the norm that reads the stream (`norm_weight`).

Why the norm's weight is applied to the stack: headscope's bridge is unprocessed (no fold_ln), so
the final norm's weight still sits in the final norm, not in W_U, and ln1/ln2's weights still sit
in the norms, not in W_Q/W_K/W_V/W_in. TransformerLens's recipes multiply `apply_ln_to_stack`'s
output by the weights that read it; applying the norm's weight in `apply_ln_to_stack` makes
every such recipe (`logit_attrs`, `stack @ model.tokens_to_residual_directions(t)`,
`stack @ (W_U[:, a] - W_U[:, w])`) give the numbers TransformerLens gives on a folded model, with
this model's own weights. Folding the weight into the directions instead would leave the plain
W_U recipe silently wrong (the product is the same either way; only one place may hold it).
"""
from __future__ import annotations

import operator
import warnings
import weakref
from collections import Counter
from typing import Any

import torch

from headscope.errors import ConfigError, HeadscopeWarning
from headscope.hooks.memories import mlp_memories
from headscope.hooks.post_norm import post_mlp_norm, through_norm
from headscope.models.moe_layout import expert_layout


def slice_axis(t: torch.Tensor, sl: Any, dim: int) -> torch.Tensor:
    """TransformerLens's Slice on one axis: None keeps it; an int indexes (the axis goes); a tuple
    is slice(*tuple); a slice slices; a list, array or 1-d tensor of ints gathers. A
    transformer_lens Slice object works too."""
    if sl is None:
        return t
    if hasattr(sl, "mode") and hasattr(sl, "slice"):  # transformer_lens.utilities.Slice
        sl = sl.slice
    if isinstance(sl, tuple):
        sl = slice(*sl)
    if not isinstance(sl, slice):
        try:
            sl = operator.index(sl)  # ints, numpy and 0-d torch integers
        except TypeError:
            idx = torch.as_tensor(sl if isinstance(sl, torch.Tensor) else list(sl), dtype=torch.long)
            if idx.ndim != 1:
                raise ConfigError(f"A slice of indices must be 1-d, got shape {list(idx.shape)}.") from None
            size = t.shape[dim]
            return t.index_select(dim % t.ndim, torch.where(idx < 0, idx + size, idx).to(t.device))
    index: list[Any] = [slice(None)] * t.ndim
    index[dim] = sl
    return t[tuple(index)]


def norm_weight(model, layer: int | None, mlp_input: bool = False) -> torch.Tensor | None:
    """[d_model]: the weight a norm multiplies the normalised stream by (1 + w where the model's
    RMSNorm uses an offset, as Gemma's): the final norm (layer None), else block `layer`'s ln1
    (ln2 with mlp_input). None where that norm has no weight (LNPre, RMSPre)."""
    bridge = model.bridge
    owner, name = (bridge, "ln_final") if layer is None else (bridge.blocks[layer], "ln2" if mlp_input else "ln1")
    ln = getattr(owner, name, None)
    weight = getattr(ln, "weight", None) if ln is not None else None
    if not isinstance(weight, torch.Tensor):
        return None
    weight = weight.detach()
    return 1.0 + weight if getattr(bridge.cfg, "rmsnorm_uses_offset", False) else weight


_SCALED: dict[int, weakref.ref] = {}  # id -> the tensors apply_ln_to_stack returned (scaled by a norm), while alive


def mark_scaled(stack: torch.Tensor) -> torch.Tensor:
    """`stack`, recorded as already scaled by a norm (apply_ln_to_stack's output; every apply_ln=True goes through
    it): logit_attrs refuses it, since it applies the final norm itself (review 17b B3: the scaled stack of
    decompose_resid(apply_ln=True) summed to 7.35 for a logit difference of 12.49, the norm applied twice)."""
    key = id(stack)
    _SCALED[key] = weakref.ref(stack, lambda _, key=key: _SCALED.pop(key, None))
    return stack


def is_scaled(stack: torch.Tensor) -> bool:
    """Is `stack`, or the tensor it is a view of (an index or slice such as stack[:, :, -1]), one that
    apply_ln_to_stack returned? Arithmetic on it makes a new tensor, which is not known."""
    for t in (stack, stack._base):
        ref = _SCALED.get(id(t)) if t is not None else None
        if ref is not None and ref() is t:
            return True
    return False


def _token_ids(model, tokens: Any) -> torch.Tensor:
    """Token ids as a tensor (0-d for one token; a string must be one token)."""
    if isinstance(tokens, str):
        ids = list(model.tokenizer(tokens, add_special_tokens=False)["input_ids"])
        if len(ids) != 1:
            raise ConfigError(f"{tokens!r} is {len(ids)} tokens ({ids}); pass one token or its id.")
        return torch.tensor(ids[0])
    return torch.as_tensor(tokens, dtype=torch.long)


def final_softcap(model) -> float | None:
    """The model's final-logit soft-cap c (Gemma 2/3's config.final_logit_softcapping: the output is
    c * tanh(logits / c)), None without one."""
    config = getattr(getattr(model.bridge, "original_model", None), "config", None)
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None


def _warn_softcap(model) -> None:
    """Once per model (review 18b A2): logit_attrs' rows sum to the logit (difference) before a final soft-cap."""
    cap = final_softcap(model)
    if cap is None or getattr(model, "_headscope_softcap_warned", False):
        return
    model._headscope_softcap_warned = True
    c = f"{cap:g}"
    warnings.warn(f"logit_attrs on {model.facts.name}: the rows (with incl_bias=True) sum to the logit (difference) "
                  f"before the final soft-cap {c} * tanh(x / {c}), not to the model's output; the cap is not linear, so "
                  f"no row is a share of the capped logit.", HeadscopeWarning, stacklevel=3)


def _warn_half(model, dtype: torch.dtype) -> None:
    """Once per model (review 20a C): in half precision the cached writes a stack holds are rounded to that dtype, as
    is the model's own output, so logit_attrs' rows (float32, the bias row included) sum to its logit (difference)
    only up to that rounding."""
    if dtype not in (torch.bfloat16, torch.float16) or getattr(model, "_headscope_half_attrs_warned", False):
        return
    model._headscope_half_attrs_warned = True
    name = str(dtype).removeprefix("torch.")
    warnings.warn(f"logit_attrs on {model.facts.name} in {name}: the cached writes are {name}, as is the model's output, "
                  f"so the rows (with incl_bias=True) sum to its logit (difference) only up to {name} rounding, not "
                  f"exactly as in float32.", HeadscopeWarning, stacklevel=3)


def _check_scale_shape(stack: torch.Tensor, scale: torch.Tensor, pos_slice: Any) -> None:
    """A stack [components, *axes, d_model] must carry exactly the cached scale's axes [*axes, 1]
    (after the slices): a stack sliced to some positions against every position's scale
    would broadcast into a wrong shape without a word."""
    if stack.ndim == scale.ndim + 1 and stack.shape[1:-1] == scale.shape[:-1]:
        return
    raise ConfigError(
        f"apply_ln_to_stack: the stack's axes {list(stack.shape[1:-1])} (between components and d_model) do not "
        f"match the norm scale's {list(scale.shape[:-1])} (pos_slice={pos_slice!r}); a stack sliced to some "
        f"positions needs the same pos_slice (e.g. pos_slice=-1 for stack[:, :, -1])."
    )


def _neuron_labels(layer: int, mem, n_routed: int | None) -> list[str]:
    """TransformerLens's "L{l}N{i}" for a dense MLP (n_routed None); on a mixture of experts of
    n_routed routed experts "L{l}E{e}N{i}" for expert e's neuron i and "L{l}SN{i}" for the shared
    expert's (memories' expert index n_routed), in the memories' order."""
    if n_routed is None:
        return [f"L{layer}N{i}" for i in range(mem.values.shape[0])]
    return [f"L{layer}SN{i}" if e == n_routed else f"L{layer}E{e}N{i}"
            for e, i in zip(mem.expert.tolist(), mem.neuron.tolist())]


class CacheHabits:
    """TransformerLens ActivationCache methods for Activations (which provides __getitem__, meta,
    model, n_layers, _stop, _needs_model, stack_head_results, decompose_resid, apply_ln_to_stack)."""

    @property
    def has_batch_dim(self) -> bool:
        """False after `remove_batch_dim` (entries are then [pos, ...])."""
        return bool(self.meta.get("has_batch_dim", True))

    def logit_attrs(self, residual_stack: torch.Tensor, tokens: Any, incorrect_tokens: Any = None,
                    pos_slice: Any = None, batch_slice: Any = None, has_batch_dim: bool = True, *,
                    incl_bias: bool = False) -> torch.Tensor:
        """Each component's direct contribution to the logit of `tokens` (minus `incorrect_tokens`):
        residual_stack [components, batch, pos, d_model] (or a position-sliced [components, batch,
        d_model] with pos_slice, e.g. pos_slice=-1) -> [components, batch(, pos)], as TransformerLens's.

        The stack goes through the final norm as `apply_ln_to_stack(layer=-1)` does (centred for
        LayerNorm, divided by the cached scale, times the norm's weight), then is dotted with
        `model.tokens_to_residual_directions(tokens)` (W_U columns, times the model's logit scale:
        Granite's 1 / logits_scaling). tokens: a string of one
        token, an int, a [batch] tensor (one per example, every position), a [pos] tensor of
        another length (one per position) or [batch, pos]. The rows of `decompose_resid(layer=-1)`
        then sum to the final logit (difference) less the final norm's bias and the unembedding
        bias along the direction (TransformerLens folds both into b_U and leaves them out);
        incl_bias=True appends that constant as one more row, so the rows sum to the logit
        (difference) exactly; on a model that soft-caps its final logits (Gemma 2/3's
        final_logit_softcapping c: c * tanh(x / c) after the unembedding) that is the logit
        (difference) before the final soft-cap, since the cap is not linear (the output is c * tanh of
        each logit / c), and a warning says so once per model. With a wrong answer the numbers equal TransformerLens's on a folded
        model (compatibility mode); for a single answer its center_unembed reads W_U[:, a] minus
        the vocabulary mean of W_U instead.

        Pass the unscaled stack: a stack that apply_ln_to_stack (or apply_ln=True) already scaled, or a view of
        it, is a ConfigError, since the norm would be applied twice (TransformerLens gives wrong numbers silently).
        """
        self._refuse_post_ln("logit_attrs", final_norm=True)
        if is_scaled(residual_stack):
            raise ConfigError("logit_attrs applies the final norm itself, and this stack was already scaled by a norm "
                              "(apply_ln=True or apply_ln_to_stack): the norm would be applied twice. Pass the "
                              "unscaled stack, e.g. cache.decompose_resid(pos_slice=-1) without apply_ln=True.")
        model = self._needs_model("logit_attrs")
        _warn_softcap(model)
        _warn_half(model, residual_stack.dtype)
        ids = _token_ids(model, tokens)
        directions = model.tokens_to_residual_directions(ids)  # [*ids.shape, d_model]
        wrong = None
        if incorrect_tokens is not None:
            wrong = _token_ids(model, incorrect_tokens)
            if wrong.shape != ids.shape:
                raise ConfigError(f"tokens and incorrect_tokens must have the same shape; got {list(ids.shape)} and "
                                  f"{list(wrong.shape)}.")
            directions = directions - model.tokens_to_residual_directions(wrong)
        scaled = self.apply_ln_to_stack(residual_stack, -1, pos_slice=pos_slice, batch_slice=batch_slice,
                                        has_batch_dim=has_batch_dim)
        directions = directions.to(device=scaled.device, dtype=scaled.dtype)
        rest = scaled.shape[1:-1]  # the stack's batch and position axes
        if directions.ndim == 2 and len(rest) == 2 and has_batch_dim and directions.shape[0] == rest[0]:
            directions = directions.unsqueeze(-2)  # one token per example, at every position
        try:
            fits = torch.broadcast_shapes(tuple(rest), tuple(directions.shape[:-1])) == tuple(rest)
        except RuntimeError:
            fits = False
        if not fits:
            raise ConfigError(f"logit_attrs: tokens of shape {list(ids.shape)} do not match the stack's batch and "
                              f"position axes {list(rest)}; pass one token, [batch] or [batch, pos] tokens (sliced "
                              f"like the stack).")
        attrs = (scaled * directions).sum(-1)  # [components, *rest]
        if not incl_bias:
            return attrs
        bias = torch.zeros(directions.shape[:-1], dtype=attrs.dtype, device=attrs.device)
        ln_bias = getattr(getattr(model.bridge, "ln_final", None), "bias", None)
        if isinstance(ln_bias, torch.Tensor):
            raw = model.tokens_to_residual_directions(ids) - (0 if wrong is None else model.tokens_to_residual_directions(wrong))
            bias = bias + (raw * ln_bias.detach()).sum(-1).to(bias)
        b_u = getattr(model.bridge, "b_U", None)
        if isinstance(b_u, torch.Tensor):
            b_u = b_u.detach()
            b = b_u[ids.to(b_u.device)] - (0 if wrong is None else b_u[wrong.to(b_u.device)])
            b = b * model.facts.logit_scale  # the directions carry it (tokens_to_residual_directions)
            bias = bias + (b[..., None] if bias.ndim > b.ndim else b).to(bias)
        return torch.cat([attrs, bias.expand(rest)[None]], dim=0)

    def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False, expand_neurons: bool = True,
                                     apply_ln: bool = False, pos_slice: Any = None, return_labels: bool = False,
                                     project_output_onto: torch.Tensor | None = None):
        """The stream into `layer` (its MLP with mlp_input; None / -1: the unembedding) as every
        head's result ("L0H0", ...), every neuron's (post-activation x its W_out row x the residual-write scale, "L0N0", ...;
        each layer's mlp_out with expand_neurons=False, "0_mlp_out"), "embed", "pos_embed", and
        "bias": [components, batch, pos, d_model], in TransformerLens's order and labels. On a
        mixture of experts the neurons are the memories of hooks.memories (every routed expert's,
        router weight included, "L1E0N0", ..., then the shared expert's, "L1SN0", ...), which sum
        to the MoE block's output (GPT-OSS: less its experts' output biases times their router weights, which
        no neuron writes and "bias" holds).

        "bias" is the rest of the stream (the attention output biases, and the MLP output biases
        when neurons are expanded; 0 up to rounding for bias-free models): computed as the stream
        less the other rows, so the rows sum to it exactly (TransformerLens reads the bias
        weights). On post-norm blocks (Gemma 2/3, OLMo 2) each head's and neuron's row is its write
        through the block's post-attention / post-MLP norm frozen at its scale on the whole output
        (stack_head_results, hooks.post_norm), so "bias" stays 0 there too (review 18d A1).
        apply_ln as `apply_ln_to_stack`; project_output_onto [d_model] or [d_model, k]
        multiplies the result (the last axis squeezed for a vector).
        """
        self._refuse_post_ln("get_full_resid_decomposition")
        stop, n = self._stop(layer), self.n_layers
        if mlp_input and stop == n:
            raise ConfigError("mlp_input=True reads a block's MLP input; pass a layer below n_layers.")
        heads, labels = self.stack_head_results(stop + (1 if mlp_input else 0), pos_slice=pos_slice, return_labels=True)
        comps = [heads]
        if not self.meta.get("attn_only", False) and stop > 0:
            if expand_neurons:
                model = self._needs_model("Neuron results (mlp.hook_post x W_out)")
                for l in range(stop):
                    post = slice_axis(self["mlp_post", l], pos_slice, -2)  # [batch, pos, d_mlp]
                    mem = mlp_memories(model, l)  # values [d_mlp, d_model]: W_out's rows, or every expert's
                    w_out = mem.values.detach().to(device=post.device, dtype=post.dtype)
                    scale = float(getattr(getattr(model, "facts", None), "residual_scale", 1.0))  # Granite's x0.22
                    writes = post.unsqueeze(-1) * (w_out * scale)  # [batch, pos, d_mlp, d_model] as added
                    norm = post_mlp_norm(model.bridge.blocks[l]) if self._post_norm_on() else None
                    if norm is not None:  # Gemma 2/3, OLMo 2: each neuron's write through the post-MLP norm
                        pre = post @ w_out + mem.out_bias.detach().to(post)  # [batch, pos, d_model] the MLP's output
                        normed = slice_axis(self["mlp_out", l], pos_slice, -2) if ("mlp_out", l) in self else None
                        writes = through_norm(model, norm, writes, pre, normed, f"Block {l}'s neuron writes")
                    comps.append(writes.movedim(-2, 0))  # [d_mlp, batch, pos, d_model]
                    layout = expert_layout(model, l)
                    labels += _neuron_labels(l, mem, None if layout is None else layout.n_experts)
            else:
                mlp, mlp_labels = self.decompose_resid(stop, mlp_input=mlp_input, mode="mlp", incl_embeds=False,
                                                       pos_slice=pos_slice, return_labels=True)
                comps.append(mlp)
                labels += mlp_labels
        for kind in ("embed", "pos_embed"):
            if kind in self:
                comps.append(slice_axis(self[kind], pos_slice, -2)[None])
                labels.append(kind)
        into = self._mid(stop) if mlp_input else self._resid_into(stop)
        into = slice_axis(into, pos_slice, -2)
        stack = torch.cat(comps, dim=0)
        stack = torch.cat([stack, (into - stack.sum(0))[None]], dim=0)
        labels.append("bias")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, stop, mlp_input=mlp_input, pos_slice=pos_slice)
        if project_output_onto is not None:
            proj = project_output_onto.to(device=stack.device, dtype=stack.dtype)
            stack = stack @ proj  # [components, ..., k] or [components, ...] for a vector
        return (stack, labels) if return_labels else stack

    def stack_activation(self, activation_name: str, layer: int | None = -1, sublayer_type: str | None = None) -> torch.Tensor:
        """One kind of activation of every layer before `layer` (-1 / None: all) stacked on a new
        first axis: acts.stack_activation("pattern") is [layers, batch, head, q, k]."""
        stop = self._stop(layer)
        if stop == 0:
            raise ConfigError("stack_activation(layer=0) stacks no layer; pass a layer above 0, or -1 for all.")
        return torch.stack([self[(activation_name, l, sublayer_type)] for l in range(stop)], dim=0)

    def remove_batch_dim(self, batch_size: int | None = None):
        """Drop the batch axis of a one-example cache in place (every entry, and the output, whose
        first axis is 1) and return it, as TransformerLens's; the residual helpers then take
        [components, pos, d_model] stacks. batch_size: the true batch size (default: the most
        common first axis). More than one example is a ConfigError."""
        if not self.has_batch_dim:
            warnings.warn("remove_batch_dim: the batch axis is already removed.", HeadscopeWarning, stacklevel=2)
            return self
        firsts = [v.shape[0] for v in self.values() if v.ndim]
        size = batch_size if batch_size is not None else (Counter(firsts).most_common(1)[0][0] if firsts else 1)
        if size != 1:
            raise ConfigError(f"remove_batch_dim needs a cache of one example; this one holds {size}: cache one "
                              f"(e.g. tokens[:1]).")
        for name in list(self):
            value = dict.__getitem__(self, name)
            if value.ndim and value.shape[0] == 1:
                dict.__setitem__(self, name, value[0])
        if self.output is not None and self.output.ndim and self.output.shape[0] == 1:
            self.output = self.output[0]
        self.meta["has_batch_dim"] = False
        return self
