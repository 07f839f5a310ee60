"""Logit lens: every block's input read through the model's own final norm and unembedding.

Convention (TransformerLens 4.3's `tools.analysis.logit_lens`): the accumulated residual stream
at each block input (`blocks.l.hook_resid_pre`, l = 0..n_layers-1) and after the last block
(`blocks.{n-1}.hook_resid_post`) goes through the model's `ln_final` module with its statistics
recomputed from that state (its own scale, mean and weights), then `@ W_U + b_U`, times the model's
logit scale where it has one (`facts.logit_scale`: Granite's 1 / logits_scaling). The last entry
is the model's own logits: where the model soft-caps its final logits (Gemma 2's
`final_logit_softcapping`: cap * tanh(logits / cap), as Hugging Face's causal-LM head) every entry
is capped the same way, which TransformerLens's logit_lens leaves out (ranks are unchanged, tanh is
monotone; log-probabilities and logit differences are the model's own). `output_error` in the
readout measures the last entry against the model's output so any other post-unembedding transform
is visible.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from headscope.analyses.core.metrics import spacing
from headscope.errors import ConfigError
from headscope.hooks import site
from headscope.hooks.residual import final_softcap  # the reader the cache's logit_attrs shares
from headscope.models.readout import unembed_bias, unembed_weight

TARGETS = ("next", "answer")  # lens target at position p: the token after p (the answer at the end), or the answer


def lens_sites(n_layers: int) -> list[str]:
    """The hook names the lens reads: resid_pre of every block and resid_post of the last."""
    return [site("resid_pre", l) for l in range(n_layers)] + [site("resid_post", n_layers - 1)]


def lens_labels(n_layers: int) -> list[str]:
    """TransformerLens's accumulated_resid labels: "0_pre", ..., "{n-1}_pre", "final_post"."""
    return [f"{l}_pre" for l in range(n_layers)] + ["final_post"]


def unembed(model, states: torch.Tensor) -> torch.Tensor:
    """[..., d_model] (already through the final norm) -> [..., d_vocab] logits before any soft-cap:
    (x @ P^T W_U + b_U) x facts.logit_scale (P: OPT-350m's project_out, where the model has one; the scale:
    Granite's 1 / logits_scaling, which the bridge's W_U omits)."""
    w_u = unembed_weight(model)  # [d_model, d_vocab]: through OPT-350m's project_out
    out = states.to(device=w_u.device, dtype=w_u.dtype) @ w_u  # [..., d_vocab]
    b_u = unembed_bias(model)
    out = out if b_u is None else out + b_u
    scale = model.facts.logit_scale
    return out if scale == 1.0 else out * scale


def softcapped(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(logits / cap) (Hugging Face's final soft-capping); logits as they are without a cap."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


@dataclass(frozen=True)
class LensReadout:
    """Lens values at the selected positions, all [layer (n_layers + 1), batch, pos]:
    log-probability and zero-based rank (strictly larger logits, as TransformerLens) of each
    position's target, the logit difference target - wrong (NaN where no wrong token applies), and
    the target ids [batch, pos]. output_error: max |last entry - the model's logits| (0 up to rounding). near_top:
    the target is top-1 (rank 0) but another token's logit lies within one rounding step of the model's dtype below
    it, so rounding could have put either first (review 20a B1: ties in bfloat16); None where not read."""

    logprob: torch.Tensor
    rank: torch.Tensor
    logit_diff: torch.Tensor
    targets: torch.Tensor
    output_error: float
    near_top: torch.Tensor | None = None


BLOCK_BYTES = 64 * 2**20  # float32 lens logits held at once: [rows, positions, vocabulary] of one entry


def _blocks(n_rows: int, k: int, vocab: int, block_bytes: int) -> list[slice]:
    """Slices of the k lens positions, each holding at most block_bytes of float32 logits (one at least)."""
    step = max(1, min(k, block_bytes // max(1, 4 * n_rows * vocab)))
    return [slice(s, min(s + step, k)) for s in range(0, k, step)]


@torch.no_grad()
def lens_readout(model, acts, positions: torch.Tensor, targets: torch.Tensor,
                 wrong: torch.Tensor | None = None, output: torch.Tensor | None = None,
                 block_bytes: int | None = None) -> LensReadout:
    """Read the lens at `positions` ([batch, k] indices) of a captured pass (`acts`, Activations
    holding `lens_sites` with the model attached). targets: [batch, k] token ids; wrong: [batch, k]
    (negative entries: no wrong token there) or None. output: the pass's logits [batch, pos, vocab]
    to check the last entry against.

    One stack entry and a block of positions at a time (block_bytes of float32 logits, BLOCK_BYTES
    by default), so memory stays bounded at a large vocabulary and many positions (a 128k
    vocabulary at 4k positions is 2 GB of logits per entry and row)."""
    n_layers = model.facts.n_layers
    sites = lens_sites(n_layers)
    batch, k = positions.shape
    shape = (n_layers + 1, batch, k)
    logprob, diff = torch.empty(shape), torch.full(shape, float("nan"))
    rank = torch.empty(shape, dtype=torch.int64)
    near = torch.zeros(shape, dtype=torch.bool)
    err = 0.0
    cap = final_softcap(model)  # Gemma 2: the model's own last transform of its logits
    w_all = None if wrong is None else wrong.clamp_min(0)
    for cols in _blocks(batch, k, model.facts.d_vocab, block_bytes or BLOCK_BYTES):
        pos = positions[:, cols]  # [batch, kc]
        tgt_ids = targets[:, cols]
        for i, name in enumerate(sites):
            state = acts[name]  # [batch, pos, d_model]
            index = pos.to(state.device)[:, :, None].expand(-1, -1, state.shape[-1])
            picked = state.gather(1, index)[None]  # [1, batch, kc, d_model]
            normed = acts.apply_ln_to_stack(picked, None, recompute_ln=True)  # ln_final, recomputed statistics
            raw = unembed(model, normed[0])  # [batch, kc, vocab] in the model's dtype
            logits = softcapped(raw.float(), cap)  # [batch, kc, vocab]
            tgt_logit = logits.gather(-1, tgt_ids.to(logits.device)[..., None])  # [batch, kc, 1]
            logprob[i, :, cols] = (tgt_logit - logits.logsumexp(-1, keepdim=True))[..., 0].cpu()
            rank[i, :, cols] = (logits > tgt_logit).sum(-1).cpu()  # strictly larger logits
            step = spacing(raw.dtype, tgt_logit)  # [batch, kc, 1] one step of the model's dtype there
            close = (logits >= tgt_logit - step).sum(-1) > 1  # [batch, kc]: another token within a step (or tied)
            near[i, :, cols] = (close & ((logits > tgt_logit).sum(-1) == 0)).cpu()
            if wrong is not None:
                w = wrong[:, cols]
                wl = logits.gather(-1, w_all[:, cols].to(logits.device)[..., None])[..., 0]
                diff[i, :, cols] = torch.where(w >= 0, (tgt_logit[..., 0] - wl).cpu(), diff[i, :, cols])
            if output is not None and i == n_layers:
                out = output.gather(1, pos.to(output.device)[:, :, None].expand(-1, -1, output.shape[-1]))
                err = max(err, float((out.float().to(logits.device) - logits).abs().max()))
    return LensReadout(logprob=logprob, rank=rank, logit_diff=diff, targets=targets.cpu(), output_error=err,
                       near_top=near)


def lens_targets(tokens: torch.Tensor, answers: torch.Tensor, answer_pos: torch.Tensor, target: str,
                 every_position: bool, start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, targets), both [batch, k], positions in the padded tokens' coordinates: every
    position from each example's first real token (`start` [batch], 0 when None; left padding's
    length) to its answer position (k = the longest prompt; shorter rows repeat their answer
    position) or the answer position only. target "next": the prompt's next token (the answer at
    the answer position); "answer": the answer."""
    if target not in TARGETS:
        raise ConfigError(f"lens_target must be one of {TARGETS}, got {target!r}.")
    batch = tokens.shape[0]
    start = torch.zeros(batch, dtype=torch.int64) if start is None else start.to(torch.int64).cpu()
    if not every_position:
        pos = answer_pos[:, None]  # [batch, 1]
    else:
        k = int((answer_pos - start).max()) + 1
        pos = (start[:, None] + torch.arange(k)[None, :]).minimum(answer_pos[:, None])  # [batch, k]
    if target == "answer":
        return pos, answers[:, None].expand_as(pos).clone()
    nxt = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1).gather(1, pos)  # token after each position
    return pos, torch.where(pos == answer_pos[:, None], answers[:, None], nxt)
