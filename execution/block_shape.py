"""What a decoder block is, decided in one place: sequential or parallel, pre- or post-norm.

Every resumed or hook-free pass that runs part of a block by hand (resume's z shortcut: the block
from its attention output on; the hook-free blocks' residual sums) asks this module, so the
shapes stay consistent:
- pre-norm, sequential (GPT-2, Llama, Qwen, Mistral, Mixtral): h = x + a, out = h + MLP(ln2(h));
- post-norm (OLMo 2: norms after attention and after the MLP, none before):
  h = x + ln1_post(a), out = h + ln2_post(MLP(h));
- both (Gemma 2/3): h = x + ln1_post(a), out = h + ln2_post(MLP(ln2(h)));
- parallel (GPT-NeoX/Pythia, GPT-J, Phi, Falcon): out = MLP(ln2(x)) + a + x, where a block with
  one norm (GPT-J, Phi) feeds ln1(x) to both branches.
a is the attention output o(z) (before any post-norm). TransformerLens's bridge says which: a
ParallelBlockBridge is parallel, the ln1_post / ln2 / ln2_post submodules say where the norms sit,
and a ScaledResidualBlockBridge (Granite: scaled residual writes) and OPT's post-LN block
(out = ln2(h + MLP(h)), h = ln1(x + a): models.readout) are none of these (None).
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch

from headscope.errors import UnsupportedModelError
from headscope.hooks.post_norm import post_attention_norm, post_mlp_norm  # noqa: F401 (decided in hooks: the cache reads them too)
from headscope.models.hooked_model import is_parallel, raw_module  # is_parallel: block_shape.is_parallel too
from headscope.models.readout import is_post_ln_block


class Parts(NamedTuple):
    """A block's modules after its attention output, as callables (bridge modules, whose hooks
    fire, or the raw Hugging Face modules under them)."""

    mlp: Callable[[torch.Tensor], torch.Tensor]
    ln2: Callable | None = None  # the norm before the MLP (None: the MLP reads the residual itself)
    ln1_post: Callable | None = None  # the norm of the attention output (post-norm blocks)
    ln2_post: Callable | None = None  # the norm of the MLP output (post-norm blocks)
    parallel: bool = False  # attention and MLP both read the block's input
    mlp_adds_residual: bool = False  # the MLP takes the residual and adds it itself (BLOOM's mlp(h, residual))


raw = raw_module  # the Hugging Face module under a bridge component (models.hooked_model)


def parts(block: torch.nn.Module, convert: Callable[[torch.nn.Module], Callable] | None = None) -> Parts | None:
    """The bridge block's parts after its attention (the bridge's modules, or convert(module) of
    each: e.g. a hook-free copy), or None for a block none of the shapes describes (scaled
    residual writes, no MLP)."""
    from transformer_lens.model_bridge.generalized_components.block import ScaledResidualBlockBridge

    if isinstance(block, ScaledResidualBlockBridge) or _child(block, "mlp") is None or is_post_ln_block(block):
        return None  # post-LN OPT: ln1/ln2 normalise the whole stream after each add, a shape none of the above has

    def get(name: str):
        module = _child(block, name)
        return module if module is None or convert is None else convert(module)

    parallel = is_parallel(block)
    ln2 = get("ln2")
    if parallel and ln2 is None:
        ln2 = get("ln1")  # GPT-J, Phi: one norm feeds both branches
    adds = "residual" in inspect.signature(raw(_child(block, "mlp")).forward).parameters  # BloomMLP
    return Parts(mlp=get("mlp"), ln2=ln2, ln1_post=get("ln1_post"), ln2_post=get("ln2_post"), parallel=parallel,
                 mlp_adds_residual=adds)


PROBE = 64.0  # the probes' RMS: beside 64^2 a norm's eps (1e-5, 1e-6) is below float32's rounding


@torch.no_grad()
def norm_gain(norm: torch.nn.Module) -> tuple[torch.Tensor, bool]:
    """(gain [d_model] float32 on the CPU, centres) of a norm x -> gain * c(x) / s(x) + b (c: the mean
    taken out where `centres`, LayerNorm; s: the RMS of c(x), positive and shared by the entries),
    read from what the module computes, not from its weight: Gemma's RMSNorm multiplies by
    1 + weight, OLMo 2's and Llama's by weight. A float32 copy of the module (half-precision weights
    widen exactly) is run on probes of RMS PROBE: ones (a centring norm maps them to its bias) and
    alternating signs give the gain entry by entry; a third probe checks that the module is such a
    norm, else UnsupportedModelError (never a gain from the wrong formula)."""
    module = copy.deepcopy(norm).float()
    param = next(module.parameters(), None)
    shape = getattr(module, "normalized_shape", None) or (None if param is None else param.shape)
    if not shape:
        raise UnsupportedModelError(f"{type(norm).__name__} has no weight nor normalized_shape: its width is unknown.")
    d = int(shape[-1])
    signs = 1.0 - 2.0 * (torch.arange(d) % 2)  # [d] +1, -1, ...
    check = torch.randn(d, generator=torch.Generator().manual_seed(0))  # [d]
    probes = PROBE * torch.stack([torch.zeros(d), torch.ones(d), signs, check])  # [4, d]
    out = module(probes.to(None if param is None else param.device)).float().cpu()  # [4, d]
    out = out[1:] - out[0]  # [3, d] without the bias (norm(0) = b)
    centres = not bool(out[0].any())

    def unit(x: torch.Tensor) -> torch.Tensor:  # c(x) / s(x): what the gain multiplies
        x = x - x.mean() if centres else x
        return x / x.pow(2).mean().sqrt()

    gain = out[1] / unit(signs)  # [d]
    if not torch.allclose(out[2], gain * unit(check), rtol=1e-4, atol=1e-4 * float(gain.abs().max())):
        raise UnsupportedModelError(f"{type(norm).__name__} is not a norm gain * x / rms(x) (+ bias), centred or "
                                    "not: its per-entry gain cannot be read.")
    return gain, centres


def _child(block: torch.nn.Module, name: str) -> torch.nn.Module | None:
    return block._modules.get(name)


def mlp_entry(block: torch.nn.Module) -> torch.nn.Module:
    """The bridge module whose input is the MLP branch's alone (ln2, else the MLP): cutting its
    input to the last position runs the MLP there only (the residual add broadcasts; a parallel
    block's attention output must be cut too, `last_of`: Falcon adds it into the MLP's output in
    place, `mlp_output += attention_output`, which cannot broadcast [n, 1, d] up to [n, q, d])."""
    ln2 = _child(block, "ln2")
    return ln2 if ln2 is not None else block.mlp


def last_of(out):
    """An attention module's output cut to the last position: the tensor [n, q, d_model] -> [n, 1,
    d_model], or a tuple's first entry (the rest, such as the patterns, unchanged)."""
    if isinstance(out, tuple):
        return (out[0][:, -1:],) + tuple(out[1:])
    return out[:, -1:]


def _hidden(out):
    """An MLP's output [n, q, d_model]: a tuple's first entry (GPT-OSS's MLP returns (hidden, router_scores))."""
    return out[0] if isinstance(out, tuple) else out


def residual(a: torch.Tensor, x: torch.Tensor, p: Parts, *, in_place: bool) -> torch.Tensor:
    """The block's output [n, q, d_model] from its attention output a and its input x [n, q,
    d_model], in Hugging Face's order of sums (half precision rounds each one; x + a and a + x
    are the same bits). in_place: a and the MLP's output are fresh buffers nobody else holds
    (hook-free blocks), so the sums reuse them; through the bridge a hook may keep a tensor, so
    nothing is added in place."""
    if p.parallel:
        m = _hidden(p.mlp(x if p.ln2 is None else p.ln2(x)))
        return m.add_(a).add_(x) if in_place else m + a + x
    if p.ln1_post is not None:
        a = p.ln1_post(a)
    h = a.add_(x) if in_place else x + a  # resid_mid
    if p.mlp_adds_residual and p.ln2_post is None:  # BLOOM: the MLP returns h + its write (review 16c C2)
        return p.mlp(h if p.ln2 is None else p.ln2(h), h)
    m = _hidden(p.mlp(h if p.ln2 is None else p.ln2(h)))
    if p.ln2_post is not None:
        m = p.ln2_post(m)
    return m.add_(h) if in_place else h + m


def kind(model, layer: int) -> tuple:
    """What tells block `layer` apart from others of the same model: its Hugging Face class, its
    attention type (config.layer_types: sliding or full, ...), its MLP's class (dense or experts)
    and its shape (parallel or not). Blocks of one kind run the same code on the same kind of
    arguments, so a check on one stands for all (resume.supports)."""
    block = model.bridge.blocks[layer]
    types = getattr(model.bridge.original_model.config, "layer_types", None) or ()
    mlp = _child(block, "mlp")
    return (type(raw(block)).__name__, types[layer] if layer < len(types) else None,
            None if mlp is None else type(raw(mlp)).__name__, is_parallel(block))
