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

import torch

from headscope.analyses.heads.importance import evaluate_masks
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
