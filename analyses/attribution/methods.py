"""Token-importance methods for one prediction: attention, rollout, gradients (Captum), leave-one-out.

Every method scores each input token of a batch of equal-length, unpadded sequences [batch, pos]
for the prediction the model makes: the next token at the last position (decoders), the answer at each prompt's
mask token through the checkpoint's masked-LM head (a masked LM scored at its mask, analyses/core/mask_read.py: the
decoder paths with the read position `at` [batch] instead of the last), or the mean-pooled sentence embedding (other
encoders). Gradient methods differentiate a scalar metric per
example (`forward_metric`); leave-one-out and the permutation test measure how much the output
itself moves (`prediction_change`: TVD of the next-token distribution, or 1 - cosine of the pooled
embedding for encoders), or, given a `score` (the task metric of the last-position logits), how
much that metric moves: the analysis scores leave-one-out so where the output is saturated, since a
distribution distance cannot move there (analysis.loo_metric). Gradients reach the tokens through `hook_embed`, so
Captum's layer methods attribute to each token's embedding as the first block reads it: on decoders the embedding
module's output (before a learned position embedding is added; Gemma's module includes its sqrt(d_model) scale) times
any multiplier the model applies after the module (Granite's embedding_multiplier); on BERT-style encoders the
embedding layer's whole output (word + position + token-type embeddings after the embedding LayerNorm), which is what
hook_embed holds there (`gradient_input` says which; review 13c C6: the page did not say what the saliency was taken
against). Why after the multiplier: every architecture's hook_embed then holds what enters the residual stream, so a
saliency is in the residual stream's units everywhere (grad x input and integrated gradients do not change with a
constant scale; saliency divides by it). `embedding_site` keeps that hook point in the pass for Captum (review 15a A4).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import torch

from headscope.analyses.core import mask_read
from headscope.analyses.core.metrics import answer_logprob, cosine_to_reference, logit_diff, mean_pool, noise_floor
from headscope.errors import ConfigError
from headscope.execution import batching, resume
from headscope.hooks.capture import capture
from headscope.hooks.sites import site

Forward = Callable[..., torch.Tensor]  # (tokens [batch, pos], *targets) -> [batch]
Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits [rows, 1, vocab], example [rows]) -> [rows]
GRADIENT_METRICS = ("logit_diff", "logprob", "cosine")


EMBED_SITE = "hook_embed"


def embedding_layer(model) -> torch.nn.Module:
    """The hook point holding the token embeddings [batch, pos, d_model], a module Captum can hook (hook it inside
    `embedding_site`, which makes sure the bridge calls it); a ConfigError where the bridge has none."""
    layer = model.bridge.hook_dict.get(EMBED_SITE)
    if layer is None:
        raise ConfigError(_no_site(model, "has no hook_embed hook point"))
    return layer


def _no_site(model, why: str) -> str:
    arch = type(getattr(model.bridge, "original_model", model)).__name__
    return (f"Gradient attribution (saliency, gradient x input, integrated gradients) needs a hookable token "
            f"embedding, and {model.facts.name} ({arch}) {why}.")


def _observe(act: torch.Tensor, hook) -> None:  # a TransformerLens hook that changes nothing
    return None


@contextmanager
def embedding_site(model) -> Iterator[torch.nn.Module]:
    """embedding_layer(model), kept in the forward pass while the block runs, for Captum's torch hooks.

    Captum hooks the module with plain torch hooks, which TransformerLens does not count: a bridge component that
    exposes a scaled value at its hook point calls that hook point only while a TransformerLens hook is attached
    (TL's _hook_scaled_output; Granite's hook_embed = embed_tokens(ids) x embedding_multiplier), so on Granite
    Captum's hook never fired (review 15a A4: "Forward hook did not obtain any outputs"). A no-op TransformerLens
    hook keeps the hook point in every pass; where it still does not fire, a ConfigError names the architecture."""
    layer = embedding_layer(model)
    fired: list[bool] = []

    def seen(module, args, out) -> None:
        fired[:] = [True]

    handle = layer.register_forward_hook(seen)
    try:
        with model.hooks(fwd=[(EMBED_SITE, _observe)]):
            yield layer
    except AssertionError as err:  # Captum's "Forward hook did not obtain any outputs for given layer"
        if fired:
            raise
        raise ConfigError(_no_site(model, "does not call its hook_embed hook point in the forward pass")) from err
    finally:
        handle.remove()


def embedding_scales(model) -> tuple[float, float]:
    """(inside, after): the constant the embedding module itself multiplies by (Gemma's embed_scale, sqrt(d_model))
    and the one the bridge's hook_embed applies after the module (Granite's embedding_multiplier); 1.0 for none."""
    module = model.bridge.original_model.get_input_embeddings()
    inside = getattr(module, "embed_scale", None)
    after = getattr(getattr(model.bridge, "embed", None), "_output_contribution_scale", 1.0)
    return (1.0 if inside is None else float(inside)), float(after)


def gradient_input(model) -> str:
    """What the gradient methods differentiate with respect to, in words (the summary's gradient_input): hook_embed's
    contents on this model (see the module doc)."""
    if model.facts.is_encoder:
        return ("the embedding layer's output at each token (word + position + token-type embeddings, after the "
                "embedding LayerNorm: the input of layer 0)")
    inside, after = embedding_scales(model)
    module = ("the embedding module's output" + (f", which includes its x {inside:.4g} scale" if inside != 1.0 else "")
              + (f", times the model's embedding multiplier {after:.4g}: what enters the residual stream"
                 if after != 1.0 else ""))
    d_embed = getattr(model.facts, "d_embed", None)
    if d_embed:  # review 16d B3: OPT-350m's word embeddings are narrower than the stream (project_in)
        module += f", {d_embed} wide, before project_in maps it into the {model.facts.d_model}-wide residual stream"
    if model.facts.positional == "standard":  # learned absolute positions (GPT-2): added after hook_embed
        return f"each token's embedding ({module}, before the position embedding is added)"
    return f"each token's embedding ({module}; positions enter inside attention)"


def forward_metric(model, kind: str, at_mask: bool = False) -> Forward:
    """The differentiable per-example metric as Captum's forward function.

    "logit_diff": f(tokens, answers, wrong); "logprob": f(tokens, answers);
    "cosine" (encoders): f(tokens, reference [batch, d_model]). at_mask (a masked LM scored at its mask): the same
    decoder metrics read at each row's mask, f(tokens, at [batch], answers[, wrong]) (`at` a Captum argument, so it
    follows the rows through integrated gradients' steps).
    """
    if kind not in GRADIENT_METRICS:
        raise ConfigError(
            f"Gradient attribution needs a differentiable metric, one of {GRADIENT_METRICS}; got {kind!r} "
            f"(accuracy is a step function: use logit_diff or logprob)."
        )
    if at_mask and kind == "logit_diff":
        return lambda tokens, at, answers, wrong: logit_diff(answer_logits(model, model(tokens), at), answers, wrong)
    if at_mask and kind == "logprob":
        return lambda tokens, at, answers: answer_logprob(answer_logits(model, model(tokens), at), answers)
    if kind == "logit_diff":
        last = last_position(model)
        return lambda tokens, answers, wrong: logit_diff(last(tokens), answers, wrong)
    if kind == "logprob":
        last = last_position(model)
        return lambda tokens, answers: answer_logprob(last(tokens), answers)
    return lambda tokens, reference: cosine_to_reference(model(tokens), reference, None)


def last_position(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """tokens [batch, pos] -> last-position logits [batch, 1, d_vocab], differentiable: through
    the hook-free blocks where the model supports them (resume.last_logits: less arithmetic, no
    per-block bridge cost), else a full pass. Checked at each call: hooks attached then (an
    outer hs.ablate) keep the full pass, so they act."""

    def logits(tokens: torch.Tensor) -> torch.Tensor:
        out = resume.last_logits(model, tokens) if resume.supports(model).fast_capture else None
        return model(tokens)[:, -1:] if out is None else out[:, None]

    return logits


def answer_logits(model, out: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
    """The logits the answer is read from [rows, 1, vocab]: a decoder's at its last position (out [rows, pos, vocab],
    at None), or a masked LM's at each row's mask `at` [rows] through its masked-LM head (out: final hidden states
    [rows, pos, d_model], mask_read.logits_at)."""
    return out[:, -1:] if at is None else mask_read.logits_at(model, out, at)


def prediction(model, out: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
    """What the model predicts, per row: the next-token distribution at the last position
    [batch, vocab] (decoders), the answer distribution at each row's mask `at` [batch] (a masked LM scored there),
    or the mean-pooled embedding [batch, d_model] (other encoders)."""
    if model.facts.is_encoder and at is None:
        return mean_pool(out, None)
    return answer_logits(model, out, at)[:, -1].float().softmax(-1)


def prediction_change(model, pred: torch.Tensor, ref: torch.Tensor, *, pooled: bool | None = None) -> torch.Tensor:
    """How far predictions moved from reference predictions -> [batch]: TVD = 1/2 sum |p - q|
    (distributions: decoders, a masked LM at its mask, pooled=False) or 1 - cosine similarity of the pooled
    embeddings (other encoders; pooled None: whether the model is an encoder)."""
    if model.facts.is_encoder if pooled is None else pooled:
        return 1.0 - torch.nn.functional.cosine_similarity(pred, ref, dim=-1)
    return 0.5 * (pred - ref).abs().sum(-1)


def clean_reference(model, logits: torch.Tensor, score: Score | None, at: torch.Tensor | None = None) -> torch.Tensor:
    """What output_change compares variants with, from the clean run's output [batch, pos, out]: its
    prediction [batch, out] without a score, else its score [batch] (the answer logits: the last position's, or
    at each row's mask `at` [batch])."""
    if score is None:
        return prediction(model, logits, at)
    return score(answer_logits(model, logits, at).float(), torch.arange(logits.shape[0], device=logits.device))


def output_change(model, logits: torch.Tensor, ref: torch.Tensor, example: torch.Tensor,
                  score: Score | None, at: torch.Tensor | None = None) -> torch.Tensor:
    """logits [rows, pos, out] of variants, ref (clean_reference's, one row per variant), example [rows]
    each variant's example, at [rows] each variant's mask (a masked LM; None: the last position) -> [rows]:
    prediction_change without a score; with one, score(variant) - score(clean) of the answer logits, signed, in
    the metric's units."""
    if score is None:
        return prediction_change(model, prediction(model, logits, at), ref, pooled=None if at is None else False)
    return score(answer_logits(model, logits, at).float(), example) - ref


# ---- attention ------------------------------------------------------------------------------
def attention_scores(model, tokens: torch.Tensor, at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over input tokens from the prediction's query, and Abnar & Zuidema's rollout.

    Returns (per_head [batch, layer, head, key], rollout [batch, key]). The query is the last
    position for decoders, each row's mask `at` [batch] for a masked LM scored there, and the mean over all query
    positions for other encoders (the pooled output averages every position). Rollout multiplies (0.5 A + 0.5 I)
    over layers, A the head mean; grouped-query attention still gives one pattern per query head, so nothing changes for GQA.
    """
    n_layers = model.facts.n_layers
    names = [site("pattern", layer) for layer in range(n_layers)]
    acts = capture(model, tokens, names)
    patterns = torch.stack([acts[name] for name in names], 1).float()  # [batch, layer, head, q, k]
    joint = rollout(patterns.mean(2))  # [batch, q, k]
    if at is not None:  # the mask's row
        rows = torch.arange(tokens.shape[0], device=patterns.device)
        at = at.to(patterns.device)
        return patterns[rows, :, :, at], joint[rows, at]  # [batch, layer, head, k], [batch, k]
    if model.facts.is_encoder:
        return patterns.mean(3), joint.mean(1)  # [batch, layer, head, k], [batch, k]
    return patterns[:, :, :, -1], joint[:, -1]


def rollout(layer_means: torch.Tensor) -> torch.Tensor:
    """[batch, layer, q, k] head-mean patterns -> [batch, q, k]: (0.5 A_L + 0.5 I) ... (0.5 A_1 + 0.5 I),
    rows renormalised; row q is how much each input token reaches position q through the layers."""
    n = layer_means.shape[-1]
    eye = torch.eye(n, dtype=layer_means.dtype, device=layer_means.device)  # [q, k]
    joint = eye.expand(layer_means.shape[0], n, n)  # [batch, q, k]
    for layer in range(layer_means.shape[1]):
        mixed = 0.5 * layer_means[:, layer] + 0.5 * eye  # [batch, q, k]
        mixed = mixed / mixed.sum(-1, keepdim=True)
        joint = mixed @ joint  # [batch, q, k]
    return joint


# ---- gradients (Captum) -------------------------------------------------------------------------
def gradient_scores(model, tokens: torch.Tensor, forward: Forward, targets: Sequence[torch.Tensor],
                    at: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Saliency (L2 norm of d metric / d embedding), |gradient x input| per token and that product's rounding floor.

    The gradient comes from Captum's LayerGradientXActivation on hook_embed (multiply_by_inputs off), what the first
    block reads (module doc); the product with the embedding and its sum over d_model run in float32 (review 18e A1:
    in bfloat16 the sum of a near-cancelling dot product added its own rounding). The floor (gradient_floor) bounds
    what the gradient's own rounding in the model's dtype can make of that product (at [batch]: a masked LM's mask), a
    worst case that the analysis replaces by a float32 re-run where one fits (rounding.measured_floor, review 19e A1).
    Returns {"saliency", "grad_x_input" (|g . x|), "grad_x_input_signed" (g . x), "grad_x_input_floor"}, [batch, pos] each.
    """
    from captum.attr import LayerGradientXActivation

    seen: list[torch.Tensor] = []
    with embedding_site(model) as layer:
        handle = layer.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
        try:
            grad = LayerGradientXActivation(forward, layer, multiply_by_inputs=False).attribute(
                tokens, additional_forward_args=tuple(targets)
            )  # [batch, pos, d_model]
        finally:
            handle.remove()
    g, x = grad.detach().float(), seen[-1].float()  # [batch, pos, d_model] each: the gradient and the embedding
    signed = (g * x).sum(-1)  # [batch, pos]
    return {"saliency": g.norm(dim=-1), "grad_x_input": signed.abs(), "grad_x_input_signed": signed,
            "grad_x_input_floor": gradient_floor(grad.dtype, g.norm(dim=-1), x.norm(dim=-1), at)}


def gradient_floor(dtype: torch.dtype, grad_norm: torch.Tensor, input_norm: torch.Tensor,
                   at: torch.Tensor | None = None) -> torch.Tensor:
    """Rounding floor of |gradient x input| per token -> [batch, pos]: eps(dtype) x max over the example's ranked
    tokens (the first and the last left out, as in every ranking; all where fewer than 3) of |gradient| x the token's
    |embedding| (grad_norm, input_norm [batch, pos]). The last token's own gradient (its direct path to the output)
    can be many times the others' (46.9 against at most 8.0 on the tests' one-token model), which would tie them all.

    Why: g . x is a near-cancelling dot product (|g . x| far below |g| |x|), so the gradient's rounding decides it, and
    the backward pass rounds at the scale of the largest gradient, which attention spreads over every token: the
    error of a token's gradient is about one rounding step of the largest token gradient, not of its own. Measured on
    review 18e's bfloat16 Nemotron (plain HF, bfloat16 against float32 gradients of the logit difference, 329
    ranked tokens of 20 prompts): |error of g . x| up to 0.77 of this floor (median 0.01 of it), where eps |g_t| |x_t| of
    the token's own gradient fell short by up to 16x; the bfloat16 scores were all within it. A score within it is
    rounding and says nothing of the token's importance."""
    ranked = grad_norm  # [batch, pos]: the norms are >= 0, so the left-out tokens' 0 leaves the maximum as it is
    if grad_norm.shape[-1] >= 3:
        ranked = grad_norm.masked_fill(~ranked_tokens(*grad_norm.shape, at, grad_norm.device), 0.0)
    return torch.finfo(dtype).eps * ranked.amax(-1, keepdim=True) * input_norm


def ranked_tokens(batch: int, pos: int, at: torch.Tensor | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """The tokens every ranking scores -> [batch, pos] bool: positions 1..pos-2 (the first and the last left out),
    less a masked LM's scored mask `at` [batch] (its direct path to the output, as a decoder's last token's).
    gradient_floor takes its maximum over them, analysis.gradient_rounding counts them."""
    keep = torch.zeros(batch, pos, dtype=torch.bool, device=device)  # [batch, pos]
    keep[:, 1:-1] = True
    if at is not None:
        keep[torch.arange(batch, device=keep.device), at.to(keep.device)] = False
    return keep


class IgResult(NamedTuple):
    """integrated_gradients' answer: attributions [batch, pos], Captum's convergence delta [batch], the steps used
    [batch] and the delta at half those steps [batch] (NaN where the example stopped at its first count): whether
    doubling the steps still shrank the miss, i.e. whether the step cap or something steps cannot fix stopped it."""

    attributions: torch.Tensor
    delta: torch.Tensor
    steps: torch.Tensor
    delta_half: torch.Tensor


def integrated_gradients(
    model,
    tokens: torch.Tensor,
    baselines: torch.Tensor,
    forward: Forward,
    targets: Sequence[torch.Tensor],
    *,
    n_steps: int = 32,
    max_steps: int | None = None,
    tolerance: float = 0.05,
    internal_batch_size: int | None = None,
) -> IgResult:
    """Integrated gradients on the token embeddings (Captum LayerIntegratedGradients).

    baselines: [batch, pos] token ids whose embeddings start the path. With max_steps above
    n_steps, each example's step count doubles until its |delta| <= tolerance x |metric(tokens)
    - metric(baselines)| or max_steps is reached; only the examples not yet converged run again,
    so an example's result does not depend on the others in the batch. Why: a fixed count is too
    coarse where the path crosses sharp softmax transitions (the zoo model needs ~128 Gauss-Legendre
    steps for 1%), and checking the delta is Captum's own advice. Returns (attributions [batch, pos],
    the sum over d_model, signed; Captum's convergence delta [batch] = sum(attributions) -
    (metric(tokens) - metric(baselines)); the steps used [batch]; the delta at half those steps [batch], NaN
    where none ran: IgResult). internal_batch_size: (example,
    step) rows per forward and backward pass (Captum's; None: every example's steps at once; at
    least twice the examples), so 256 steps of long prompts stay within memory.
    """
    from captum.attr import LayerIntegratedGradients

    with embedding_site(model) as layer:
        return _integrated_gradients(LayerIntegratedGradients(forward, layer), tokens, baselines, targets,
                                     n_steps=n_steps, max_steps=max_steps, tolerance=tolerance,
                                     internal_batch_size=internal_batch_size)


def _integrated_gradients(lig, tokens: torch.Tensor, baselines: torch.Tensor, targets: Sequence[torch.Tensor], *,
                          n_steps: int, max_steps: int | None, tolerance: float,
                          internal_batch_size: int | None) -> IgResult:
    """integrated_gradients' step doubling with a LayerIntegratedGradients on the hooked embedding site."""
    attr_out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)  # [batch, pos]
    delta_out = torch.zeros(tokens.shape[0], dtype=torch.float32, device=tokens.device)  # [batch]
    before = torch.full((tokens.shape[0],), float("nan"), device=tokens.device)  # [batch] delta at half the steps
    used = torch.full((tokens.shape[0],), n_steps, dtype=torch.long)  # [batch]
    todo = torch.arange(tokens.shape[0], device=tokens.device)  # [rows] examples not yet converged
    steps = n_steps
    while True:
        attr, delta = lig.attribute(
            tokens[todo], baselines=baselines[todo], additional_forward_args=tuple(t[todo] for t in targets),
            n_steps=steps, return_convergence_delta=True,
            internal_batch_size=None if internal_batch_size is None else max(internal_batch_size, 2 * len(todo)),
        )  # [rows, pos, d_model], [rows]
        attr, delta = attr.detach().sum(-1).float(), delta.detach().float()
        if steps > n_steps:
            before[todo] = delta_out[todo]
        attr_out[todo], delta_out[todo], used[todo.cpu()] = attr, delta, steps
        change = (attr.sum(-1) - delta).abs()  # [rows]: |metric(x) - metric(baseline)|
        converged = delta.abs() <= tolerance * change  # [rows]
        if max_steps is None or steps * 2 > max_steps or bool(converged.all()):
            return IgResult(attr_out, delta_out, used, before)
        todo, steps = todo[~converged], steps * 2


# ---- leave-one-out --------------------------------------------------------------------------------
def logit_rounding_floor(logits: torch.Tensor, answers: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
    """One rounding step of the logits a logit difference is read from -> [rows] float32: eps(dtype) x
    max(1, |answer logit|, |wrong logit|) of clean last-position logits [rows, vocab] in the model's own dtype
    (the spacing of floats near x is between eps/2 and eps of |x|: metrics.noise_floor).

    Why that size and not the logit difference's own spacing: in bfloat16 each logit is rounded at the lm_head
    output (upcasting afterwards changes nothing) and the blocks before it round too. Measured on review 10a's
    Phi-3 (logits near 9.6 and 2, difference 7.7, float32 against bfloat16 leave-one-out changes of the logit
    difference, 97 tokens): the largest error is 0.047-0.073 logits, 0.6-0.97 of this step (0.074-0.076), and
    twice the difference's own spacing (0.031). A leave-one-out change within it is rounding."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    size = torch.stack([logits[rows, answers].abs(), logits[rows, wrong].abs()], -1).float().amax(-1)  # [rows]
    return noise_floor(logits.dtype, size)


def tie_rounding(changes: torch.Tensor, floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """changes [rows, m], floor [rows] -> (changes with every |change| <= its row's floor set to 0, a tie in the
    ranking; the mask of those [rows, m]): a change within rounding says nothing of the token's importance."""
    within = changes.abs() <= floor.to(changes)[:, None]
    return changes.masked_fill(within, 0.0), within


def loo_variants(tokens: torch.Tensor, positions: Sequence[int], *, mode: str, baseline_token: int | None) -> torch.Tensor:
    """[batch, pos] -> [batch * len(positions), pos'] inputs, example-major: one token removed
    (mode "remove", pos' = pos - 1) or replaced by `baseline_token` (mode "replace")."""
    batch, n = tokens.shape
    idx = torch.as_tensor(list(positions), dtype=torch.long, device=tokens.device)  # [m]
    if mode == "remove":
        keep = torch.arange(n, device=tokens.device)[None, :] != idx[:, None]  # [m, pos]
        kept = keep.nonzero()[:, 1].reshape(len(idx), n - 1)  # [m, pos - 1]
        return tokens[:, kept].reshape(batch * len(idx), n - 1)
    if mode == "replace":
        if baseline_token is None:
            raise ConfigError("leave-one-out with mode='replace' needs baseline_token= (e.g. the pad or unk id).")
        out = tokens[:, None, :].repeat(1, len(idx), 1)  # [batch, m, pos]
        out[:, torch.arange(len(idx)), idx] = baseline_token
        return out.reshape(batch * len(idx), n)
    raise ConfigError(f"leave-one-out mode must be 'remove' or 'replace', got {mode!r}.")


@torch.no_grad()
def leave_one_out(
    model,
    tokens: torch.Tensor,
    positions: Sequence[int],
    *,
    mode: str = "remove",
    baseline_token: int | None = None,
    batch_size: int = 256,
    reuse_prefix: bool | None = None,
    score: Score | None = None,
    at: torch.Tensor | None = None,
) -> torch.Tensor:
    """Output change when each token in `positions` is left out -> [batch, len(positions)]: the
    prediction_change, or with `score` (decoders; permutation.Score: the task metric of last-position
    logits [rows, 1, vocab] of examples [rows]) the metric's signed change score(variant) - score(clean).

    Two exact strategies (same results up to float rounding):
    - reuse_prefix (decoders; the default for them): a causal model's states before position p
      do not depend on token p, so the clean run's KV cache, cut at p, serves every variant that
      changes p; one forward per position runs only the suffix, all examples together. Saves
      about half the compute and most of the per-pass overhead. (A sliding-window model whose
      cache dropped early positions runs stacked instead.)
    - stacked (encoders, or reuse_prefix=False): all variants of all examples run as full
      sequences in chunks of `batch_size` (halved on out-of-memory).
    A pass holds at most batch_size sequences either way (at most 64 from the cached prefix).
    at [batch] (a masked LM scored at its mask): the answer is read at each row's mask, which moves one to the left
    where an earlier token is removed; leaving out the mask itself removes the question, not a token of its
    context, so that change is NaN (the analysis leaves the mask out of its rankings, as a decoder's query token).
    """
    return leave_one_out_with_clean(model, tokens, positions, mode=mode, baseline_token=baseline_token,
                                    batch_size=batch_size, reuse_prefix=reuse_prefix, score=score, at=at)[0]


@torch.no_grad()
def leave_one_out_with_clean(
    model,
    tokens: torch.Tensor,
    positions: Sequence[int],
    *,
    mode: str = "remove",
    baseline_token: int | None = None,
    batch_size: int = 256,
    reuse_prefix: bool | None = None,
    score: Score | None = None,
    at: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """leave_one_out's changes [batch, len(positions)] and the clean run's answer output [batch, out] (the last
    position's, or the masked-LM head's at each row's mask `at`) in the model's dtype that they are measured against
    (None without positions): the attribution analysis reads its rounding floor from it (loo_rounding) instead of
    running the clean pass again."""
    positions = list(positions)
    if not positions:
        return tokens.new_zeros((tokens.shape[0], 0), dtype=torch.float32), None
    if not all(0 <= p < tokens.shape[1] for p in positions):
        raise ConfigError(f"leave-one-out positions must lie in [0, {tokens.shape[1]}), got {positions}.")
    loo_variants(tokens[:1], positions[:1], mode=mode, baseline_token=baseline_token)  # validates mode / token
    if reuse_prefix is None:
        reuse_prefix = not model.facts.is_encoder
    if score is not None and model.facts.is_encoder and at is None:
        raise ConfigError("leave-one-out's score= reads answer logits; an encoder not scored at its mask has none.")
    if at is not None:
        reuse_prefix = False  # a bidirectional encoder: every variant runs whole
    if reuse_prefix:
        out = _loo_cached_prefix(model, tokens, positions, mode=mode, baseline_token=baseline_token,
                                 rows=min(64, batch_size), score=score)
        if out is not None:
            return out
    clean = model(tokens)  # [batch, pos, out]
    ref = clean_reference(model, clean, score, at).repeat_interleave(len(positions), dim=0)  # [batch*m, ...]
    example = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(len(positions))  # [batch*m]
    variants = loo_variants(tokens, positions, mode=mode, baseline_token=baseline_token)  # [batch*m, pos']
    moved, itself = variant_reads(at, positions, mode, tokens.shape[1])  # [batch*m] each, or None

    def change(rows: range) -> torch.Tensor:  # [len(rows)]
        part = slice(rows.start, rows.stop)
        return output_change(model, model(variants[part]), ref[part], example[part], score,
                             None if moved is None else moved[part])

    changes = torch.cat([c for _, c in batching.run_chunks(change, variants.shape[0], batch_size)])  # halved on OOM
    if itself is not None:
        changes = changes.float().masked_fill(itself, float("nan"))  # the mask itself left out: no context token
    return changes.reshape(tokens.shape[0], len(positions)), answer_logits(model, clean, at)[:, -1]


def variant_reads(at: torch.Tensor | None, positions: Sequence[int], mode: str,
                  n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Where each leave-one-out variant (example-major, loo_variants) is read and which leave out the mask itself
    -> (read positions [batch*m], bool [batch*m]), or (None, None) without a mask (`at` None): removing a token
    before the mask moves it one to the left; a variant without its mask is read at a valid position and its
    change discarded."""
    if at is None:
        return None, None
    idx = torch.as_tensor(list(positions), dtype=torch.long, device=at.device)  # [m]
    where = at[:, None].expand(-1, len(idx))  # [batch, m]
    itself = where == idx[None, :]  # [batch, m]
    if mode == "remove":
        where = where - (idx[None, :] < where).long()
        where = where.clamp_max(n - 2)  # a removed last mask is still read in range (n - 1 tokens left)
    return where.reshape(-1), itself.reshape(-1)


def _loo_cached_prefix(model, tokens: torch.Tensor, positions: list[int], *, mode: str,
                       baseline_token: int | None, rows: int = 64,
                       score: Score | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Leave-one-out for decoders from the clean KV cache, with the clean run's last-position logits [batch, vocab]
    (None when the cache dropped early positions: sliding-window layers on a prompt longer than the window).

    Positions go in blocks; a block starting at p0 shares the clean cache cut at p0 and runs,
    for each of its variants, the variant's tokens from p0 on (all the same length), stacked
    along the batch axis up to about `rows` sequences. Recomputing the few unchanged tokens
    between p0 and p costs less than one more forward pass.
    """
    from headscope.hooks.kv_states import cached_forward, holds_prefix, new_cache, prefix_cache

    if model.facts.is_encoder:
        raise ConfigError("reuse_prefix needs a causal decoder; use reuse_prefix=False for encoders.")
    tokens = model.check_tokens(tokens)
    batch = tokens.shape[0]
    logits, clean = cached_forward(model, tokens, new_cache(model), 0)  # [batch, pos, vocab]
    if not holds_prefix(clean, tokens.shape[1]):
        return None  # a sliding-window cache dropped early positions: the caller runs full sequences
    ref = clean_reference(model, logits, score)  # [batch, vocab] or [batch]
    order = sorted(range(len(positions)), key=lambda k: positions[k])
    block = max(1, min(8, rows // batch))
    out = torch.empty(batch, len(positions))
    for i in range(0, len(order), block):
        ks = order[i : i + block]
        p0 = positions[ks[0]]
        variants = loo_variants(tokens, [positions[k] for k in ks], mode=mode, baseline_token=baseline_token)
        suffix = variants[:, p0:]  # [batch * b, n'], example-major
        if suffix.shape[1] == 0:  # only the last token removed: the prediction moves back one position
            last = logits[:, p0 - 1 : p0]  # [batch, 1, vocab]
        else:
            cache = prefix_cache(model, clean, p0, rows=torch.arange(batch).repeat_interleave(len(ks)))  # example-major
            last, _ = cached_forward(model, suffix, cache, p0)  # [batch * b, n', vocab]
        per = last.shape[0] // batch  # variants per example, example-major
        example = torch.arange(batch, device=tokens.device).repeat_interleave(per)  # [batch * per]
        change = output_change(model, last, ref.repeat_interleave(per, 0), example, score)
        out[:, ks] = change.float().cpu().reshape(batch, -1)
    return out, logits[:, -1]
