"""The heads rounding floor, measured: how far the ablation sweep's own rounding moves the metric when
nothing is ablated.

A null ablation replaces every head of one layer with itself, g z + (1 - g) z, through the ablation
sweep's own gate hooks and resumed passes (importance.evaluate_masks, the replacement being the heads'
own captured z): exact arithmetic leaves z as it is, while floating point rounds g z and (1 - g) z
(NULL_GATES are not powers of two), so z moves by about one rounding step, and every block after it
rounds its now different inputs afresh. The metric's change is what rounding alone does to the mean
metric of a run that resumes at that block: bfloat16 on the zoo model (logits about 11, metric 25),
0.004-0.055, against float32 changes of at most 1e-6. The floor is NULL_MARGIN x the largest |change| over the
NULL_GATES x layers null ablations (more gates sample the rounding more often: review 13a C3)
(as patching's rounding_floor, analyses/patching/attribution_patching.py): 0.11 there (0.094 from two gates), against the
analytic one step of the logits, 0.20, while bfloat16 importances differ from float32's by at most
0.04 (tests/analyses/test_heads_rounding.py).

A plain recomputation is no measurement: the resumed bfloat16 pass reproduces the captured one
bitwise, and a null edit that leaves z bitwise unchanged is skipped by the sweep (no pass). Where every
null change is exactly 0 (or no ablation ran) the analytic floor stands (metrics.noise_floor).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from headscope.analyses.heads.importance import evaluate_masks, gate_gradient_stats
from headscope.hooks import capture, site

# not powers of two, and 1 - g differs from another's g: distinct roundings. Review 13a C3: two gates (1/3, 0.1)
# undersampled the rounding, 2 x their largest change 1.06e-5 against L2H3's bfloat16-vs-float32 error 1.18e-5;
# four gates give 1.57e-5 there (and on the tiny llama, task seed 3, 0.034 instead of 0.021), at 2 L more passes
NULL_GATES = (1 / 3, 0.1, 0.7, 0.45)
NULL_MARGIN = 2.0  # the floor: this many times the largest |null change| (patching's IDENTITY_MARGIN)


def null_masks(n_layers: int, n_heads: int) -> torch.Tensor:
    """[1 + len(NULL_GATES) x n_layers, L, H]: all ones (the baseline, copy 0), then per gate g and layer l
    (copy 1 + i L + l for gate i) every head of layer l at g."""
    masks = torch.ones(1 + len(NULL_GATES) * n_layers, n_layers, n_heads)
    for i, gate in enumerate(NULL_GATES):
        for layer in range(n_layers):
            masks[1 + i * n_layers + layer, layer] = gate
    return masks


def null_effects(model, scorer, *, max_tokens: int | None = None, progress: bool = False) -> torch.Tensor:
    """The mean metric change (baseline - null, as an importance) of each null ablation:
    [len(NULL_GATES) x n_layers] float64, gate-major. One capture pass for the heads' z, then one sweep
    of the null masks, as the ablation sweep runs its masks."""
    f = model.facts
    names = [site("z", layer) for layer in range(f.n_layers)]
    acts = capture(model, scorer.tokens, names, attention_mask=scorer.attention_mask)
    own = {layer: acts[name] for layer, name in enumerate(names)}  # [batch, pos, head, d_head] each head's own z
    values = evaluate_masks(model, scorer, null_masks(f.n_layers, f.n_heads), replacement=own,
                            max_tokens=max_tokens, progress=progress, desc="null ablation")  # [1 + G L]
    return values[0] - values[1:]


def measured_floor(effects: torch.Tensor) -> float | None:
    """NULL_MARGIN x the largest |null change|; None where there is none or all are exactly 0 (nothing measured)."""
    mag = effects.detach().double().abs()
    mag = mag[torch.isfinite(mag)]
    if not mag.numel() or float(mag.max()) == 0.0:
        return None
    return NULL_MARGIN * float(mag.max())


# Gate gradients' rounding, measured (reviews 14b A2, 14c A1: the analytic GRADIENT_TIE_STEPS eps x E_x max_h |dL/d xi_h|
# was 15-30x what bfloat16 moved the mean gradients): the gate gradients recomputed with the weights in float32 for up to
# GRADIENT_CHECK_EXAMPLES examples. Where that is every example, each head's mean rounds by exactly |mean g - mean g32|,
# and the floor is the largest over heads; else a head's mean over all examples rounds by at most about the mean |g - g32|
# over the sample (no cancellation assumed), the floor GRADIENT_CHECK_MARGIN x its largest. Above GRADIENT_CHECK_MAX_BYTES
# of float32 weights no copy is made and the analytic bound stands (the summary says so).
GRADIENT_CHECK_EXAMPLES = 64
GRADIENT_CHECK_MARGIN = 2.0
GRADIENT_CHECK_MAX_BYTES = 4 * 2 ** 30


@contextlib.contextmanager
def weights_in_float32(module: torch.nn.Module) -> Iterator[None]:
    """Every floating-point parameter and buffer of `module` below float32 computed in float32 inside the block and
    given back bitwise afterwards (the original tensors are kept, not cast back)."""
    params: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}
    buffers: list[tuple[dict, str, torch.Tensor]] = []
    try:
        for m in module.modules():
            for p in m._parameters.values():
                if p is not None and p.is_floating_point() and p.dtype.itemsize < 4 and id(p) not in params:
                    params[id(p)] = (p, p.data)
                    p.data = p.data.float()
            for name, b in m._buffers.items():
                if b is not None and b.is_floating_point() and b.dtype.itemsize < 4:
                    buffers.append((m._buffers, name, b))
                    m._buffers[name] = b.float()
        yield
    finally:
        for p, data in params.values():
            p.data = data
        for store, name, b in buffers:
            store[name] = b


def float32_weight_bytes(model) -> int:
    """The bytes a float32 copy of the model's sub-float32 weights and buffers takes."""
    seen: set[int] = set()
    total = 0
    for t in [*model.bridge.parameters(), *model.bridge.buffers()]:
        if t.is_floating_point() and t.dtype.itemsize < 4 and id(t) not in seen:
            seen.add(id(t))
            total += 4 * t.numel()
    return total


def gradient_check(model, scorer, examples: torch.Tensor, *, n: int = GRADIENT_CHECK_EXAMPLES) -> dict:
    """The gate gradients' rounding measured against float32: examples [L, H, N] the run's own |dL_x/d xi_h| (importance_
    table's per-example values, in example order), the first min(n, N) recomputed. Returns {"floor", "n_examples",
    "of", "exact" (every example recomputed), "max_error_of_mean" (max_h |mean g - mean g32| over them), "max_mean_error"
    (max_h mean |g - g32|), "max_error", "margin" (1 where exact),
    "heads" ([L][H] each head's own rounding: |mean g - mean g32| where exact, else margin x mean |g - g32|; a pair of
    heads ties within the sum of theirs), "reason"}; no floor, and the reason, where nothing was
    measured (a float32 model, weights over GRADIENT_CHECK_MAX_BYTES, a pass that failed)."""
    out: dict = {"n_examples": 0, "of": int(examples.shape[-1]), "floor": None}
    if model.dtype.itemsize >= 4:
        return {**out, "reason": f"the model runs in {str(model.dtype).removeprefix('torch.')}"}
    size = float32_weight_bytes(model)
    if size > GRADIENT_CHECK_MAX_BYTES:
        return {**out, "reason": f"a float32 copy of the weights ({size / 2 ** 30:.1f} GiB) exceeds "
                                 f"{GRADIENT_CHECK_MAX_BYTES / 2 ** 30:.0f} GiB"}
    m = min(n, examples.shape[-1], len(scorer))
    mask = scorer.attention_mask
    sub = dataclasses.replace(scorer, tokens=scorer.tokens[:m], attention_mask=None if mask is None else mask[:m])
    try:
        with weights_in_float32(model.bridge):
            g32 = gate_gradient_stats(model, sub).examples  # [L, H, m] float64
    except (RuntimeError, TypeError) as err:  # a dtype fixed at load time somewhere in the pass
        return {**out, "reason": f"the float32 recomputation failed ({type(err).__name__})"}
    own = examples[..., :m].double()  # [L, H, m]
    err = (own - g32).abs()  # [L, H, m]
    of_mean = torch.nan_to_num((torch.nanmean(own, -1) - g32.mean(-1)).abs())  # [L, H] each head's mean's rounding
    mean = torch.nan_to_num(torch.nanmean(err, -1))  # [L, H]
    exact = m == examples.shape[-1]
    margin = 1.0 if exact else GRADIENT_CHECK_MARGIN
    heads = of_mean if exact else margin * mean  # [L, H] each head's own measured rounding (review 14b verify A1)
    return {**out, "n_examples": m, "exact": exact, "max_error_of_mean": float(of_mean.max()),
            "max_mean_error": float(mean.max()), "max_error": float(torch.nan_to_num(err).max()), "margin": margin,
            "floor": float(heads.max()), "heads": heads.tolist(), "reason": None}
