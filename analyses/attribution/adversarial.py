"""Adversarial attention (Jain & Wallace 2019, section 4): attention far from the model's own that
leaves the output as it is.

At one layer, the prediction's attention rows of every head (the last query row for decoders;
the mask's row on a masked LM scored at its mask; every row for other encoders) are replaced by learned
distributions alpha' = softmax(theta), and z = alpha' @ v is written at hook_z, as in the permutation test. theta
starts at the model's own log-attention plus a little seeded noise, and projected gradient ascent maximises

    mean over heads and rows of JSD(alpha', alpha)   subject to   output change <= epsilon

with the model's weights frozen. alpha' lives on the keys the model's mask lets the row see
(permutation.key_support: causal, and a sliding-window layer's window, models.layer_windows): the keys it
masks stay at exactly 0, so the search never reads a distribution the layer cannot produce (review 17d A2).
The output change is the TVD of the next-token distribution (decoders) or 1 - cosine of the pooled embedding
(encoders). Per example we keep the largest JSD among the steps whose output change was <= epsilon (0 if none
was). JSD uses natural logarithms, so its maximum is ln 2 ~ 0.693: J&W's finding is that, for many examples,
attention can be moved that far without changing the prediction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headscope.analyses.attribution.methods import answer_logits, prediction, prediction_change
from headscope.analyses.attribution.permutation import Generators, Score, key_support, per_example, prediction_rows, z_hook
from headscope.errors import ConfigError
from headscope.hooks.sites import site

LN2 = math.log(2.0)


def jsd(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Jensen-Shannon divergence (nats) between distributions on the last axis -> [...]."""
    m = 0.5 * (p + q)
    kl_pm = (p * ((p + eps).log() - (m + eps).log())).sum(-1)
    kl_qm = (q * ((q + eps).log() - (m + eps).log())).sum(-1)
    return 0.5 * (kl_pm + kl_qm)


@dataclass(frozen=True)
class AdversarialAttention:
    jsd: torch.Tensor  # [batch] best mean-over-heads JSD with output change <= epsilon (0 if never)
    change: torch.Tensor  # [batch] the output change of that solution
    attention: torch.Tensor  # [batch, head, r, k] the adversarial rows (the original where none was found)
    original: torch.Tensor  # [batch, head, r, k] the model's own rows
    feasible: torch.Tensor  # [batch] bool: some step met the epsilon bound
    metric_change: torch.Tensor | None = None  # [batch] score at the adversarial rows - clean score (with a score)


def adversarial_attention(
    model,
    tokens: torch.Tensor,
    *,
    layer: int,
    epsilon: float = 0.01,
    steps: int = 100,
    lr: float = 1.0,
    noise: float = 0.1,
    generator: Generators = None,
    score: Score | None = None,
    at: torch.Tensor | None = None,
) -> AdversarialAttention:
    """Search adversarial attention at `layer` for each example of `tokens` [batch, pos] (unpadded).

    All examples are optimised together (one forward and two backward passes per step); each has
    its own theta, so the result per example does not depend on the others. lr is the length of
    an ascent step in logit space, decayed linearly to 0. generator: one for the batch, or one per
    example (its noise then does not depend on the batch). score: the task metric of the last-position
    logits (permutation.Score); its change at the adversarial rows is kept, one more forward pass. at [batch]: a
    masked LM's mask positions: the mask's row is searched and the output (TVD, score) read there.
    """
    model.check_layer(layer)
    if steps < 1 or epsilon <= 0:
        raise ConfigError(f"adversarial attention needs steps >= 1 and epsilon > 0, got steps={steps}, epsilon={epsilon}.")
    pooled = None if at is None else False  # a masked LM's output: the answer distribution at its mask
    ref, rows, v, last = prediction_rows(model, tokens, layer, at)  # [batch, out], [batch, head, r, k], [batch, k, head, d_head]
    rows, v = rows.float(), v.float()
    draws = per_example(generator, rows.shape[0], lambda n, g: torch.randn((n, *rows.shape[1:]), generator=g))
    theta = rows.clamp_min(1e-9).log() + noise * draws.to(rows.device)  # [batch, head, r, k]
    hidden = ~key_support(model, layer, tokens.shape[1]).to(rows.device)  # [k] keys the mask hides: kept at 0
    best = torch.zeros(rows.shape[0], device=rows.device)  # [batch]
    best_change = torch.zeros_like(best)
    best_rows = rows.clone()
    feasible = torch.zeros(rows.shape[0], dtype=torch.bool, device=rows.device)
    for step in range(steps):
        theta = theta.detach().requires_grad_(True)  # [batch, head, r, k]
        with torch.enable_grad():
            alpha = theta.masked_fill(hidden, float("-inf")).softmax(-1)  # [batch, head, r, k]
            new_z = torch.einsum("bhrk,bkhd->brhd", alpha, v)  # [batch, r, head, d_head]
            out = model.run_with_hooks(tokens, fwd=[(site("z", layer), z_hook(new_z, at))])
            change = prediction_change(model, prediction(model, out, at), ref, pooled=pooled)  # [batch]
            div = jsd(alpha, rows).mean((1, 2))  # [batch]
            # rows of the batch are independent, so gradients of sums are per-example gradients
            (g_div,) = torch.autograd.grad(div.sum(), theta, retain_graph=True)
            (g_change,) = torch.autograd.grad(change.sum(), theta)
        with torch.no_grad():
            ok = (change <= epsilon) & (div > best)
            best = torch.where(ok, div, best)
            best_change = torch.where(ok, change, best_change)
            best_rows[ok] = alpha[ok]
            feasible |= change <= epsilon
            theta = theta.detach() + _step(g_div, g_change, change, epsilon, lr * (1 - step / steps))
    moved = None
    if score is not None:
        with torch.no_grad():
            new_z = torch.einsum("bhrk,bkhd->brhd", best_rows, v)  # [batch, r, head, d_head]
            logits = model.run_with_hooks(tokens, fwd=[(site("z", layer), z_hook(new_z, at))])
            index = torch.arange(len(tokens), device=tokens.device)
            moved = (score(answer_logits(model, logits, at).float(), index) - score(last.float(), index)).cpu()
    return AdversarialAttention(jsd=best.cpu(), change=best_change.cpu(), attention=best_rows.cpu(),
                                original=rows.cpu(), feasible=feasible.cpu(), metric_change=moved)


def _step(g_div: torch.Tensor, g_change: torch.Tensor, change: torch.Tensor, epsilon: float,
          length: float) -> torch.Tensor:
    """Projected gradient ascent on the JSD under the output-change bound, per example.

    Near the bound (change > epsilon / 2) the part of the JSD gradient that would increase the
    change is projected out, so the step slides along the bound; past it, a Gauss-Newton step
    brings the change back to epsilon / 2. The ascent step has a fixed length in logit space.
    """
    shape = g_div.shape
    gd, gc = g_div.flatten(1), g_change.flatten(1)  # [batch, P]
    gc_sq = (gc * gc).sum(1, keepdim=True).clamp_min(1e-20)  # [batch, 1]
    along = (gd * gc).sum(1, keepdim=True)  # [batch, 1]
    near = (change[:, None] > 0.5 * epsilon) & (along > 0)  # [batch, 1]
    ascent = torch.where(near, gd - along / gc_sq * gc, gd)  # [batch, P]
    ascent = length * ascent / ascent.norm(dim=1, keepdim=True).clamp_min(1e-20)
    excess = (change[:, None] - 0.5 * epsilon).clamp_min(0.0) * (change[:, None] > epsilon)  # [batch, 1]
    back = excess / gc_sq * gc  # [batch, P]
    back = back * (length / back.norm(dim=1, keepdim=True).clamp_min(length))  # at most `length` long
    return (ascent - back).reshape(shape)
