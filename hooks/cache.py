"""Activations: the cache object of a forward pass, with TransformerLens's ActivationCache habits.

A plain dict of TransformerLens hook name -> tensor (so code that indexes by full name keeps
working), plus `output` (logits for decoders, hidden states for encoders) and what
TransformerLens users reach for: short keys (`acts["pattern", 1]`, `acts["resid_pre", -1]`,
`acts["embed"]`), `stack_head_results`, `accumulated_resid`, `decompose_resid`, `.to(device)`,
and safetensors `save` / `load`; hooks/residual.py adds `logit_attrs`,
`get_full_resid_decomposition`, `stack_activation` and `remove_batch_dim`. The residual-stream
helpers follow transformer_lens/ActivationCache.py (4.3), with TransformerLens's pos_slice; one
difference throughout: `apply_ln` applies the norm's weight (the model is unprocessed; see
hooks/residual.py for why), others are stated in each docstring.
"""
from __future__ import annotations

import json
import operator
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch

from headscope.errors import ConfigError, IndexOutOfRangeError, SiteError, UnsupportedModelError
from headscope.hooks.post_norm import has_post_norms, post_attention_norm, through_norm
from headscope.hooks.residual import CacheHabits, _check_scale_shape, mark_scaled, norm_weight, slice_axis
from headscope.hooks.sites import ALIASES, SITES, _suggest, site
from headscope.models.readout import NO_SUM, POST_LN, readout_gap

FORMAT = "headscope.Activations/1"  # safetensors metadata marker
OUTPUT_KEY = "output"  # the forward's output in a saved file (no hook name is a bare "output")
NORMS = {"LN", "LNPre", "RMS", "RMSPre"}  # normalisations apply_ln knows (as TransformerLens)
# TransformerLens short names (transformer_lens.utilities.get_act_name) -> headscope site kinds
NORM_KINDS = {"scale", "normalized"}  # norm hook points: ln_final.hook_scale, blocks.L.ln1.hook_scale
_COMPACT = re.compile(r"^([a-z_]+?)(\d+)([a-z]\w*)?$")  # TransformerLens's "k6", "scale4ln1"
_LAYER = re.compile(r"^blocks\.(\d+)\.")


def head_result(model, layer: int, z: torch.Tensor) -> torch.Tensor:
    """Per-head output from z: [batch, pos, head, d_head] @ W_O[head] -> [batch, pos, head, d_model].

    Scaled like the bridge's own hook_result where a block scales its residual write (Granite).
    """
    attn = model.bridge.blocks[layer].attn
    w_o = attn.W_O.to(device=z.device, dtype=z.dtype)  # [head, d_head, d_model]
    out = torch.einsum("...hd,hdm->...hm", z, w_o)  # [batch, pos, head, d_model] (or [pos, head, d_model])
    scale = getattr(attn, "_result_contribution_scale", 1.0)
    return out if scale == 1.0 else out * scale


def model_meta(model) -> dict[str, Any]:
    """What the helpers need from the model, kept so a saved cache works without it."""
    cfg = model.bridge.cfg
    return {
        "model": model.facts.name,
        "n_layers": model.facts.n_layers,
        "n_heads": model.facts.n_heads,
        "normalization": str(getattr(cfg, "normalization_type", None)),
        "final_rms": bool(getattr(cfg, "final_rms", False)),
        "attn_only": bool(getattr(cfg, "attn_only", False)),
        "parallel": bool(getattr(cfg, "parallel_attn_mlp", False)),  # attention and MLP read the same stream
        "post_ln": bool(getattr(model.facts, "post_ln", False)),  # OPT post-LN: no linear decomposition
        "post_norm": has_post_norms(model),  # Gemma 2/3, OLMo 2: writes pass a norm of their own (hooks.post_norm)
        "readout_gap": readout_gap(model),  # why no linear read into the logits (models.readout), None where one exists
    }


class Activations(CacheHabits, dict):
    """name -> tensor, plus `output` (logits for decoders, hidden states for encoders).

    `model` (the HookedModel, None after `load` unless given) computes per-head results from z
    and the final norm for `accumulated_resid(apply_ln=True)`; it is not pickled or saved.
    """

    output: torch.Tensor | None = None
    model: Any = None

    def __init__(self, data=(), *, output: torch.Tensor | None = None, model=None, meta: dict | None = None) -> None:
        super().__init__(data)
        self.output = output
        self.model = model
        self.meta = dict(meta) if meta is not None else (model_meta(model) if model is not None else {})

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "model"}

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in self.items())
        out = f"; output {list(self.output.shape)}" if self.output is not None else ""
        return f"Activations({len(self)} sites: {shapes}{out})"

    # ---- keys ---------------------------------------------------------------------------
    def __getitem__(self, key) -> torch.Tensor:
        """Full names, or TransformerLens short keys: "embed", ("pattern", 1), ("resid_pre", -1),
        ("scale", 0, "ln1"), "k6". A bare per-layer kind works when one layer of it is stored."""
        if isinstance(key, str) and dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return dict.__getitem__(self, self.resolve(key))

    def __contains__(self, key) -> bool:
        try:
            return dict.__contains__(self, self.resolve(key))
        except (SiteError, IndexOutOfRangeError, ConfigError, TypeError):
            return False

    def get(self, key, default=None):
        return self[key] if key in self else default

    @property
    def n_layers(self) -> int:
        if "n_layers" in self.meta:
            return int(self.meta["n_layers"])
        layers = [int(m.group(1)) for k in self if (m := _LAYER.match(k))]
        if not layers:
            raise ConfigError("These activations name no layers and carry no model facts; capture them with run_with_cache.")
        return max(layers) + 1

    def resolve(self, key) -> str:
        """The stored full name a key stands for; SiteError (with close names) when none is."""
        if isinstance(key, str) and dict.__contains__(self, key):
            return key
        if isinstance(key, str) and ("." in key or key.startswith("hook_")):
            raise SiteError(f"{key!r} was not captured. Did you mean {_suggest(key, self)}?")
        if isinstance(key, str):
            match = _COMPACT.match(key)
            parts = (match.group(1), int(match.group(2)), match.group(3)) if match else (key, None, None)
        elif isinstance(key, tuple) and 1 <= len(key) <= 3 and isinstance(key[0], str):
            parts = (*key, None, None)[:3]
        else:
            raise SiteError(f"Activations keys are names or (kind, layer[, 'ln1'/'ln2']) tuples, got {key!r}.")
        kind, layer, layer_type = parts
        kind = ALIASES.get(kind, kind)
        if layer is not None:
            try:
                layer = operator.index(layer)  # ints, numpy and 0-d torch integers
            except TypeError:
                raise SiteError(f"The layer of key {key!r} must be an int, got {layer!r}.") from None
            n = self.n_layers
            if not -n <= layer < n:
                raise IndexOutOfRangeError(f"layer {layer} is out of range for {n} layers (key {key!r}).")
            layer %= n
        name = self._name(kind, layer, layer_type, key)
        if not dict.__contains__(self, name):
            raise SiteError(f"{name!r} (from key {key!r}) was not captured. Did you mean {_suggest(name, self)}?")
        return name

    def _name(self, kind: str, layer: int | None, layer_type: str | None, key) -> str:
        if kind in NORM_KINDS:
            norm = {"a": "ln1", "m": "ln2"}.get(layer_type or "", layer_type)
            if layer is None:
                return f"ln_final.hook_{kind}"
            if norm not in ("ln1", "ln2"):
                raise SiteError(f"Norm key {key!r} needs 'ln1' or 'ln2', e.g. ({kind!r}, {layer}, 'ln1').")
            return f"blocks.{layer}.{norm}.hook_{kind}"
        if kind not in SITES:
            raise SiteError(f"Unknown site kind {kind!r} in key {key!r}. Did you mean {_suggest(kind, [*SITES, *ALIASES])}?")
        per_layer = "{layer}" in SITES[kind].template
        if not per_layer:
            if layer is not None:
                raise SiteError(f"{kind!r} is not per layer; use acts[{kind!r}].")
            return site(kind)
        if layer is not None:
            return site(kind, layer)
        pattern = re.escape(SITES[kind].template).replace(re.escape("{layer}"), r"\d+")
        stored = [k for k in self if re.fullmatch(pattern, k)]
        if len(stored) != 1:
            raise SiteError(f"{kind!r} is per layer and {len(stored)} layers of it are stored; use acts[{kind!r}, layer].")
        return stored[0]

    # ---- devices and files --------------------------------------------------------------
    def to(self, device: str | torch.device) -> Activations:
        """Move every tensor (and the output) to `device` in place and return self, like
        ActivationCache.to, so `acts.to("cpu")` frees accelerator memory."""
        for name in list(self):
            dict.__setitem__(self, name, dict.__getitem__(self, name).to(device))
        if self.output is not None:
            self.output = self.output.to(device)
        return self

    def cpu(self) -> Activations:
        return self.to("cpu")

    def save(self, path: str | os.PathLike) -> Path:
        """Write a safetensors file (names as keys, the output as "output", facts as metadata),
        atomically: a temp file in the same folder, then os.replace."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        items = list(self.items()) + ([(OUTPUT_KEY, self.output)] if self.output is not None else [])
        for name, value in items:
            t = value.detach().to("cpu").contiguous()
            ptr = t.untyped_storage().data_ptr()
            tensors[name] = t.clone() if ptr in seen else t  # safetensors refuses shared storage
            seen.add(ptr)
        metadata = {
            "format": FORMAT,
            "names": json.dumps(list(self)),
            "output": "1" if self.output is not None else "0",
            "meta": json.dumps(self.meta),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata=metadata)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, model=None, device: str | torch.device = "cpu") -> Activations:
        """Read a file written by `save` (any safetensors file: every tensor becomes an entry).
        Pass `model` for the helpers that need weights (heads from z, the final norm)."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path), device=str(device))
        ours = metadata.get("format") == FORMAT
        output = tensors.pop(OUTPUT_KEY) if ours and metadata.get("output") == "1" else None
        names = json.loads(metadata["names"]) if ours else list(tensors)
        meta = json.loads(metadata["meta"]) if ours else (model_meta(model) if model is not None else {})
        return cls({n: tensors[n] for n in names}, output=output, model=model, meta=meta)

    # ---- residual stream (TransformerLens ActivationCache semantics) ---------------------
    def _stop(self, layer: int | None) -> int:
        """A 'components before layer l' index in 0..n_layers; None and -1 mean n_layers (all)."""
        n = self.n_layers
        if layer is None:
            return n
        try:
            layer = operator.index(layer)
        except TypeError:
            raise IndexOutOfRangeError(f"layer must be an int in 0..{n} or -1, got {layer!r}.") from None
        if not -(n + 1) <= layer <= n:
            raise IndexOutOfRangeError(f"layer {layer} is out of range: use 0..{n} (n_layers = all), or -1 for all.")
        return layer % (n + 1)

    def _refuse_post_ln(self, what: str, *, final_norm: bool = False) -> None:
        """One line before any work (review 16d A4) where the blocks are post-LN (the stream is not a sum of writes)
        or, with final_norm (a read through the final norm), where the bridge hooks no final norm (pre-LN OPT)."""
        gap = self.meta.get("readout_gap")
        if self.meta.get("post_ln", False) or (final_norm and gap):
            name = self.meta.get("model", "this model")
            raise UnsupportedModelError(f"{what} cannot run on {name}: {gap or POST_LN + NO_SUM}.")

    def _needs_model(self, what: str):
        if self.model is None:
            raise ConfigError(f"{what} needs the model's weights; load with Activations.load(path, model=model).")
        return self.model

    def _post_norm_on(self) -> bool:
        """Do some blocks pass their writes through a norm of their own (meta "post_norm"; a file saved before
        that key: asked of the model where one is given)?"""
        post = self.meta.get("post_norm")
        return bool(post) if post is not None else self.model is not None and has_post_norms(self.model)

    def _head_results(self, layer: int, pos_slice=None) -> torch.Tensor:
        """[batch, pos, head, d_model] (pos_slice: those positions): each head's write to the stream, captured
        hook_result or z @ W_O; on a post-norm block (Gemma 2/3, OLMo 2) passed through its post-attention norm
        frozen at its scale on the whole attention output (hooks.post_norm), so the heads sum to hook_attn_out
        less the normed b_O."""
        name = site("result", layer)
        if dict.__contains__(self, name):
            raw = dict.__getitem__(self, name)
        else:
            raw = head_result(self._needs_model("Per-head results from hook_z"), layer, self["z", layer])
        raw = slice_axis(raw, pos_slice, -3)  # [batch, pos, head, d_model], [batch, head, d_model] for an int
        if not self._post_norm_on():
            return raw
        model = self._needs_model("Per-head writes through the post-attention norm")
        norm = post_attention_norm(model.bridge.blocks[layer])
        if norm is None:
            return raw
        pre = raw.sum(-2)  # [batch, pos, d_model]: the attention output before the norm
        b_o = getattr(model.bridge.blocks[layer].attn, "b_O", None)
        if isinstance(b_o, torch.Tensor):
            pre = pre + b_o.detach().to(pre)
        out = site("attn_out", layer)
        normed = slice_axis(dict.__getitem__(self, out), pos_slice, -2) if dict.__contains__(self, out) else None
        return through_norm(model, norm, raw, pre, normed, f"Block {layer}'s head writes")

    def stack_head_results(
        self, layer: int | None = -1, *, return_labels: bool = False, incl_remainder: bool = False,
        pos_slice=None, apply_ln: bool = False,
    ):
        """Each head's write to the residual stream, for the heads of layers before `layer`: z_h @ W_O
        (hook_result), and on post-norm blocks (Gemma 2/3, OLMo 2) that through the block's post-attention norm
        frozen at its scale on the whole attention output (hooks.post_norm), as it reaches the stream (review
        18d A1: TransformerLens's raw hook_result there is before the norm, 6-25x off).

        Returns [layer * n_heads (+1), batch, pos, d_model] (labels "L0H0", ..., "remainder" with
        return_labels). incl_remainder adds the rest of the stream into `layer` (biases,
        embeddings, MLPs). apply_ln divides by the cached scale of the norm reading the stream
        there (centring first for LayerNorm) and multiplies by its weight (see apply_ln_to_stack).
        pos_slice (TransformerLens's: an int, tuple, slice or indices) keeps those positions.
        Differs from TransformerLens at layer=0 with incl_remainder: the remainder is resid_pre of
        block 0 (TransformerLens reads resid_post of the last block there).
        """
        stop = self._stop(layer)
        # each [head, batch, pos, d_model]
        parts = [self._head_results(l, pos_slice).movedim(-2, 0) for l in range(stop)]
        labels = [f"L{l}H{h}" for l in range(stop) for h in range(parts[l].shape[0])]
        if parts:
            stack = torch.cat(parts, dim=0)  # [layer * head, batch, pos, d_model]
        else:
            ref = slice_axis(self["embed"] if "embed" in self else self["resid_pre", 0], pos_slice, -2)  # [batch, pos, d_model]
            stack = ref.new_zeros((0, *ref.shape))
        if incl_remainder:
            resid = slice_axis(self._resid_into(stop), pos_slice, -2)  # [batch, pos, d_model]
            stack = torch.cat([stack, (resid - stack.sum(dim=0))[None]], dim=0)
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, stop, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    stack_heads = stack_head_results

    def _resid_into(self, stop: int) -> torch.Tensor:
        return self["resid_post", stop - 1] if stop > 0 else self["resid_pre", 0]

    def accumulated_resid(
        self, layer: int | None = None, *, incl_mid: bool = False, apply_ln: bool = False,
        pos_slice=None, mlp_input: bool = False, return_labels: bool = False,
    ):
        """The residual stream at each block input up to `layer`: [components, batch, pos, d_model].

        Labels "0_pre", "0_mid" (incl_mid), ..., "final_post" (layer = n_layers, the default).
        mlp_input adds resid_mid of `layer`. apply_ln: at the final layer each entry goes through
        the model's final norm (statistics recomputed per entry, weights applied: the logit lens; @ W_U
        gives logits before a final soft-cap, Gemma 2/3's c * tanh(x / c), which hs.logit_lens applies);
        before it, entries are divided by the cached ln1/ln2 scale of `layer` (TransformerLens's
        rule) and multiplied by that norm's weight. pos_slice keeps those positions.
        Parallel-block models (GPT-NeoX) have no resid_mid, so incl_mid raises SiteError.
        """
        stop, n = self._stop(layer), self.n_layers
        if apply_ln:
            self._refuse_post_ln("accumulated_resid(apply_ln=True) (the logit lens)", final_norm=stop == n)
        comps, labels = [], []
        for l in range(stop + 1):
            if l == n:
                comps.append(self["resid_post", n - 1])
                labels.append("final_post")
                continue
            comps.append(self["resid_pre", l])
            labels.append(f"{l}_pre")
            if (incl_mid and l < stop) or (mlp_input and l == stop):
                comps.append(self._mid(l))
                labels.append(f"{l}_mid")
        stack = torch.stack([slice_axis(c, pos_slice, -2) for c in comps], dim=0)  # [components, batch, pos, d_model]
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, stop, mlp_input=mlp_input, pos_slice=pos_slice, recompute_ln=stop == n)
        return (stack, labels) if return_labels else stack

    def _projected(self, embed: torch.Tensor) -> torch.Tensor:
        """hook_embed [batch, pos, d_embed] as it enters the stream: through project_in where the word embedding is
        narrower than the stream (OPT-350m: review 16d A4), else as it is."""
        proj = getattr(getattr(self.model, "bridge", None), "project_in", None)
        if not getattr(getattr(self.model, "facts", None), "d_embed", None) or proj is None:
            return embed
        with torch.no_grad():
            return proj(embed.to(self.model.device)).to(embed.device)

    def _mid(self, layer: int) -> torch.Tensor:
        if self.meta.get("parallel", False):
            raise SiteError(f"Block {layer} has no resid_mid: attention and MLP run in parallel (GPT-NeoX, GPT-J).")
        return self["resid_mid", layer]

    def decompose_resid(
        self, layer: int | None = None, *, mlp_input: bool = False, mode: Literal["all", "mlp", "attn"] = "all",
        apply_ln: bool = False, pos_slice=None, incl_embeds: bool = True, return_labels: bool = False,
    ):
        """The residual stream into `layer` split by writer: [components, batch, pos, d_model].

        Labels "embed", "pos_embed" (learned positions), "0_attn_out", "0_mlp_out", ...; their sum
        is resid_pre of `layer` (resid_post of the last block for layer = n_layers, the default).
        mode "attn"/"mlp" keeps one kind; mlp_input adds attn_out of `layer`. apply_ln divides by
        the cached norm scale there (centring for LayerNorm), as TransformerLens does, and
        multiplies by the norm's weight (apply_ln_to_stack). pos_slice keeps those positions
        (decompose_resid(apply_ln=True, pos_slice=-1) is [components, batch, d_model]).
        """
        if mode not in ("all", "mlp", "attn"):
            raise ConfigError(f"mode must be 'all', 'mlp' or 'attn', got {mode!r}.")
        self._refuse_post_ln("decompose_resid")
        stop = self._stop(layer)
        incl_attn, incl_mlp = mode != "mlp", mode != "attn" and not self.meta.get("attn_only", False)
        comps, labels = [], []
        if incl_embeds:
            for kind in ("embed", "pos_embed"):
                if kind in self:
                    comps.append(self._projected(self[kind]) if kind == "embed" else self[kind])
                    labels.append(kind)
        for l in range(stop):
            if incl_attn:
                comps.append(self["attn_out", l])
                labels.append(f"{l}_attn_out")
            if incl_mlp:
                comps.append(self["mlp_out", l])
                labels.append(f"{l}_mlp_out")
        if mlp_input and incl_attn:
            comps.append(self["attn_out", stop])
            labels.append(f"{stop}_attn_out")
        if not comps:
            raise ConfigError("Nothing to decompose: layer=0 with incl_embeds=False has no components.")
        stack = torch.stack([slice_axis(c, pos_slice, -2) for c in comps], dim=0)  # [components, batch, pos, d_model]
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, stop, mlp_input=mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self, stack: torch.Tensor, layer: int | None = None, mlp_input: bool = False, pos_slice=None,
        batch_slice=None, has_batch_dim: bool = True, recompute_ln: bool = False,
    ) -> torch.Tensor:
        """A stack of residual components [components, batch, pos, d_model] as the norm reading the
        stream at `layer` (None / -1 / n_layers: the final norm; ln2 of `layer` with mlp_input)
        passes the whole stream on: centred (LayerNorm), divided by the cached scale
        (blocks.L.ln1/ln2.hook_scale, ln_final.hook_scale) and multiplied by the norm's weight.

        The weight is where TransformerLens differs: its folded model moves it into W_U, W_Q,
        W_K, W_V and W_in, and headscope's model is unprocessed, so it is applied here; then
        `apply_ln_to_stack(stack) @ W_U[:, a]` (or any weight that reads the norm) equals
        TransformerLens's folded numbers (hooks/residual.py says why here and not in the
        directions). The norm's bias is left out (a constant, not a component's; `logit_attrs`
        can add it as a row). pos_slice: the stack holds those positions only (e.g. -1 for
        stack[:, :, -1]); batch_slice selects examples of the stack (has_batch_dim=True) and of
        the scale. A stack whose axes do not match the scale's after the slices is a ConfigError,
        never a silent broadcast. recompute_ln at the final layer runs the model's final norm on
        each component, bias included (the logit lens; tracking gradients only when the stack
        does). Models without LayerNorm/RMSNorm get the stack back unchanged. A scaled stack is marked
        (residual.mark_scaled): logit_attrs, which scales by the final norm itself, refuses it and its views.
        """
        self._refuse_post_ln("apply_ln_to_stack", final_norm=self._stop(layer) == self.n_layers)
        stop, n = self._stop(layer), self.n_layers
        if has_batch_dim:
            stack = slice_axis(stack, batch_slice, 1)
        norm = self.meta.get("normalization")
        if norm not in NORMS:
            return stack
        if recompute_ln and stop == n:
            model = self._needs_model("The final norm of accumulated_resid(apply_ln=True)")
            ln_final, device = model.bridge.ln_final, model.device
            with torch.set_grad_enabled(torch.is_grad_enabled() and stack.requires_grad):  # detached in, detached out
                return mark_scaled(torch.stack([ln_final(c.to(device)).to(stack.device) for c in stack], dim=0))
        key = ("scale", None, None) if stop == n else ("scale", stop, "ln2" if mlp_input else "ln1")
        try:
            scale = self[key]  # [batch, pos, 1]
        except SiteError as err:
            raise SiteError(f"apply_ln needs the norm scale {err}; run_with_cache captures the scales by default.") from None
        scale = slice_axis(scale, pos_slice, -2)
        if self.has_batch_dim:
            scale = slice_axis(scale, batch_slice, 0)
        _check_scale_shape(stack, scale, pos_slice)
        weight = norm_weight(self._needs_model("apply_ln (the norm's weight)"), None if stop == n else stop, mlp_input)
        if norm in ("LN", "LNPre") and not (stop == n and self.meta.get("final_rms", False)):
            stack = stack - stack.mean(dim=-1, keepdim=True)
        stack = stack / scale
        return mark_scaled(stack if weight is None else stack * weight.to(device=stack.device, dtype=stack.dtype))
