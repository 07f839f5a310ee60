"""Head importance: Michel et al.'s gate gradients and batched single-head ablation.

Every head h gets a gate xi_h that scales its output (z_h -> xi_h z_h at hook_z).
- Gradient importance I_h = E_x |dL(x)/dxi_h| at the current gates: one forward and one backward
  pass per batch of examples, for all heads together. Each example gets its own copy of the
  gates, so the per-example absolute value is exact, not |mean gradient|.
- Ablation importance = baseline metric - metric with head h alone ablated (zero, mean or
  resample). Many heads per forward pass: the batch is stacked once per head along the batch
  axis, and one hook per layer gives each copy its own head mask.
`run_gated` is the one primitive underneath (per-row gates and replacement values). For decoder
metrics read at the last position, `evaluate_masks` (a sweep of execution/sweep.py, as exact
patching's) resumes each mask's pass at the first block where it differs from a reference mask
(execution/resume.py): a head in block l costs blocks l..L-1, and block l itself only its output
projection and MLP (pre-norm blocks, sequential or parallel).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from headscope.analyses.core import mask_read, metrics
from headscope.analyses.core.tasks import Task, prompts_only
from headscope.errors import ConfigError, InputTypeError
from headscope.execution import batching, distributed, resume, sweep
from headscope.hooks import capture, site
from headscope.hooks.interventions import METHODS, resample_partners
from headscope.models.hooked_model import left_padding_starts

ABLATIONS = METHODS  # the ablation methods, one list with hooks.interventions (one meaning of "resample")
# The in-batch contrastive loss's logit scale for encoder gradients. Temperature 1, not the training scale 20
# of sentence-transformers' MultipleNegativesRankingLoss: at 20 the softmax over the batch saturates at the
# unmodified model (p(own sentence) = 1 - 1e-7), so |dL/d gate| is rounding (all-MiniLM-L6-v2, 16 shipped
# sentences: 9e-9 to 2.2e-7 at 20; 5e-4 to 5e-3 at 1).
CONTRASTIVE_SCALE = 1.0
RowFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (output [n, ...], rows [n]) -> [n]


@dataclass(frozen=True, kw_only=True)
class Scorer(metrics.Metric):
    """The heads Metric: how a Task is scored, per row of a (possibly stacked) batch; `rows` index
    the examples. kind: the Task's metric name; metric: higher is better. grad_loss: what gate
    gradients differentiate. objective: what L0 training minimises. As a plain Metric (fn, or
    calling it) it scores the output of the whole task batch, rows 0..batch-1.
    """

    kind: str
    tokens: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor | None  # [batch, pos]
    metric: RowFn
    grad_loss: RowFn
    objective: RowFn
    fn: metrics.MetricFn | None = None  # set from metric in __post_init__
    answers: torch.Tensor | None = None  # [batch] or [batch, k] a task's answer tokens (decoders; readout_stats)
    chance: float | None = None  # a log-probability's chance (span_chance): the pruning tolerance's far end
    loss_dtype: torch.dtype | None = None  # what grad_loss is computed in where wider than the pass (None: the pass's)
    mask_task: dict | None = None  # an encoder task's prompts holding the mask token, which it does not score (mask_task)
    read: RowFn | None = None  # (out, rows) -> the logits the metric reads, where not the output itself (the mask's)
    mask_read: dict | None = None  # an encoder task scored at its mask (mask_read.mask_read), for the summary

    def __post_init__(self) -> None:
        if self.fn is None:
            object.__setattr__(self, "fn", lambda out: self.metric(out, torch.arange(out.shape[0], device=out.device)))

    def __len__(self) -> int:
        return self.tokens.shape[0]


def make_scorer(model, task: Task | torch.Tensor | Scorer) -> Scorer:
    """A Scorer for a Task, or for a [batch, pos] token tensor (LM loss on text); a Scorer is
    returned as is.

    - logit_diff / logprob: L is the metric itself; accuracy (not differentiable): L = log p(answer).
      Answers of several tokens (Task.continuation): the metrics read the last k positions, so
      passes return every position's logits (no last-position shortcut).
    - an encoder with its masked-LM head on a task whose prompts each hold exactly one mask token and give
      one-token answers (mask_read.mask_positions): the decoder metrics above, read at each prompt's mask through
      the head (Scorer.read) instead of at the last position.
    - cosine (other encoders, whatever the task's metric: its prompts only, tasks.prompts_only): the metric is
      the cosine to the unmodified model's pooled embedding. Its
      gradient vanishes at the unmodified model (cosine 1 is the maximum), so gradients use an
      in-batch contrastive loss against the reference embeddings of all sentences instead, at
      temperature 1 (CONTRASTIVE_SCALE: the training scale 20 saturates and its gradient vanishes too).
    - text tokens: metric = -mean next-token cross-entropy, L = the cross-entropy.
    Decoder objectives for L0 training are the answer's cross-entropy; cosine's is 1 - cosine.
    """
    if isinstance(task, Scorer):
        return task
    if isinstance(task, torch.Tensor):
        tokens = model.check_tokens(task)
        if model.facts.is_encoder or tokens.shape[1] < 2:
            raise ConfigError("LM loss on text needs a decoder and prompts of at least 2 tokens; pass a Task instead.")

        def lm_loss(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            tgt = tokens[rows, 1:]  # [n, pos - 1]
            ce = torch.nn.functional.cross_entropy(out[:, :-1].transpose(1, 2), tgt, reduction="none")  # [n, pos - 1]
            return ce.mean(1)

        return Scorer(name="text", kind="lm", tokens=tokens, attention_mask=None,
                      metric=lambda out, rows: -lm_loss(out, rows), grad_loss=lm_loss, objective=lm_loss,
                      chance=-math.log(model.facts.d_vocab))
    if not isinstance(task, Task):
        raise InputTypeError(f"task must be a headscope Task or a [batch, pos] token tensor, got {type(task).__name__}.")
    at = mask_read.mask_positions(model, task)  # [batch] an encoder's mask positions where it is scored there
    masked = mask_task(model, task) if model.facts.is_encoder and at is None else None
    if model.facts.is_encoder and at is None:  # the prompts only: scored by the pooled embedding
        task = prompts_only(task)
    tokens = model.check_tokens(task.tokens)
    mask = None if task.attention_mask is None else task.attention_mask.to(model.device)  # [batch, pos]
    if mask is not None and not model.facts.is_encoder:
        left_padding_starts(mask, len(task), what=f"Task {task.name!r}: each answer is read at the last position")
    if task.metric == "cosine":
        return _cosine_scorer(model, task, tokens, mask, masked)
    answers = task.answer_tokens.to(model.device)  # [batch], or [batch, k] for answers of several tokens
    wrong = None if task.wrong_answers is None else task.wrong_answers.to(model.device)
    read = _mask_reader(model, at)  # (out, rows) -> the logits each metric reads

    def logprob(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return metrics.answer_logprob(read(out, rows), answers[rows])

    if task.metric == "logit_diff":
        if wrong is None:
            raise ConfigError(f"Task {task.name!r} has metric logit_diff but no wrong_answers; add them or use 'logprob'.")

        def logit_diff(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            return metrics.logit_diff(read(out, rows), answers[rows], wrong[rows])

        metric: RowFn = logit_diff
    elif task.metric == "logprob":
        metric = logprob
    elif task.metric == "accuracy":

        def accuracy(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            return metrics.accuracy(read(out, rows), answers[rows])

        metric = accuracy
    else:
        raise ConfigError(f"Unknown metric {task.metric!r}; use one of {metrics.METRICS}.")
    grad_loss = logprob if task.metric == "accuracy" else metric
    return Scorer(name=task.name, kind=task.metric, tokens=tokens, attention_mask=mask, metric=metric,
                  grad_loss=grad_loss, objective=lambda out, rows: -logprob(out, rows),
                  last_position=task.continuation is None and at is None, answers=answers,
                  chance=span_chance(task, model.facts.d_vocab), read=None if at is None else read,
                  mask_read=None if at is None else mask_read.mask_read(model, task, at))


def _mask_reader(model, at: torch.Tensor | None) -> RowFn:
    """What the decoder metrics read of a pass's output: the output itself (a decoder's logits, read at the last
    position), or on an encoder scored at its mask (`at` [batch], mask_read.mask_positions) the masked-LM head's
    logits at each row's mask [n, 1, vocab] from its final hidden states [n, pos, d_model]."""
    if at is None:
        return lambda out, rows: out
    at = at.to(model.device)
    return lambda out, rows: mask_read.logits_at(model, out, at[rows])


def span_chance(task: Task, vocab: int) -> float | None:
    """The chance value a log-probability's pruning tolerance is measured from (pruning.tolerance_band): each row's
    k log(1/vocab) for its k answer tokens, averaged over the rows (the chance record's uniform_chance,
    analyses/core/chance.py; a fixed scale for the tolerance, not the guard's verdict, which sets each answer
    against the model's own every-token mean since review 13a A2); None for other metrics (a logit difference's
    chance is its own zero, accuracy and cosine keep their own scale)."""
    if task.metric != "logprob":
        return None
    k = 1.0 if task.continuation is None else float((task.continuation >= 0).sum(1).double().mean())
    return -k * math.log(vocab)


def mask_task(model, task: Task) -> dict | None:
    """Review 15c B1: {mask_token, n_prompts (those holding it), of, answers (the task gives them), mlm_head (the
    checkpoint has one: mask_read.mlm_head)} where an encoder task scored by the cosine has prompts holding the
    tokenizer's mask token: a fill-in task whose answer is not scored at its mask (mask_read.mask_positions says
    when it is); None where no prompt holds it."""
    hits = mask_read.mask_hits(model, task)  # [batch] or None
    k = 0 if hits is None else int((hits > 0).sum())
    if not k:
        return None
    return {"mask_token": str(model.tokenizer.mask_token), "n_prompts": k, "of": len(task),
            "answers": task.answers is not None, "mlm_head": mask_read.mlm_head(model) is not None}


def _cosine_scorer(model, task: Task, tokens: torch.Tensor, mask: torch.Tensor | None,
                   masked: dict | None = None) -> Scorer:
    with torch.no_grad():
        reference = metrics.mean_pool(encoder_hidden(model, tokens, [], mask), mask)  # [batch, d_model]
    ref_unit = torch.nn.functional.normalize(reference, dim=-1)  # [batch, d_model]

    def pooled(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return metrics.mean_pool(out, None if mask is None else mask[rows])  # [n, d_model]

    def cosine(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        emb = pooled(out, rows)  # [n, d_model] float32 (mean_pool) whatever the pass's dtype
        return torch.nn.functional.cosine_similarity(emb, reference[rows].to(emb.dtype), dim=-1)

    def contrastive(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        emb = torch.nn.functional.normalize(pooled(out, rows), dim=-1)  # [n, d_model]
        logits = CONTRASTIVE_SCALE * emb @ ref_unit.T.to(emb.dtype)  # [n, batch] (float32 recomputation: rounding.py)
        return torch.nn.functional.cross_entropy(logits, rows, reduction="none")

    return Scorer(name=task.name, kind="cosine", tokens=tokens, attention_mask=mask, metric=cosine,
                  grad_loss=contrastive, objective=lambda out, rows: 1 - cosine(out, rows),
                  loss_dtype=torch.promote_types(model.dtype, torch.float32),  # mean_pool's upcast (review 15c A2)
                  mask_task=masked)


def run_gated(
    model,
    tokens: torch.Tensor,
    gates: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    replacement: dict[int, torch.Tensor] | None = None,
    last_only: bool = False,
) -> torch.Tensor:
    """One forward pass with head h of row n scaled by gates[n, layer, h].

    tokens [n, pos]; gates [n, n_layers, n_heads]. With `replacement` (layer -> values of z,
    [n or 1 or a divisor of n, pos, head, d_head]) a head becomes g z + (1 - g) replacement, so
    gate 0 means "replaced". Layers whose gates are all 1 (and need no gradient) get no hook.
    last_only (decoders): only the last position's logits [n, 1, d_vocab], from the hook-free
    blocks where the model supports them (resume.last_logits: the last block runs its last query
    only), differentiable like the full pass.
    """
    if last_only and not model.facts.is_encoder and resume.supports(model).fast_capture:
        out = resume.last_logits(model, tokens, attention_mask=attention_mask, edit_z=_gate_edit(gates, replacement))
        if out is not None:
            return out[:, None]
    fwd = gate_hooks(gates, replacement)
    if model.facts.is_encoder:
        return encoder_hidden(model, tokens, fwd, attention_mask)
    out = model.run_with_hooks(tokens, fwd=fwd, attention_mask=attention_mask)
    return out[:, -1:] if last_only else out


def _gate_edit(gates: torch.Tensor, replacement: dict[int, torch.Tensor] | None):
    """gate_hooks as an edit_z for resume.last_logits (its last block sees the last position only)."""
    replacement = replacement or {}
    layers = set(_gated_layers(gates))

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:  # [n, q, head, d_head]
        if layer not in layers:
            return z
        r = replacement.get(layer)
        return gated_z(z, gates[:, layer], None if r is None else r[:, r.shape[1] - z.shape[1]:])

    return edit


def gated_z(z: torch.Tensor, gates: torch.Tensor, replacement: torch.Tensor | None) -> torch.Tensor:
    """z [n, pos, head, d_head] with head h of row r -> g z + (1 - g) replacement, g = gates[r, h]
    ([n, head]); replacement [n or 1 or a divisor of n, pos, head, d_head] (None: zero)."""
    g = gates.to(z.device, z.dtype)[:, None, :, None]  # [n, 1, head, 1] (z's device: sharded models)
    if replacement is None:
        return z * g
    n = z.shape[0]
    if replacement.shape[0] not in (1, n):
        replacement = replacement.repeat(n // replacement.shape[0], 1, 1, 1)  # copies stacked along the batch
    return z * g + (1 - g) * replacement.to(z.device, z.dtype)


def gate_hooks(gates: torch.Tensor, replacement: dict[int, torch.Tensor] | None = None, *,
               after: int = -1) -> list[tuple[str, Any]]:
    """hook_z hooks applying `gated_z` per layer, gates [n, L, H]; only layers after `after` whose
    gates are not all 1 (or that need a gradient) get one."""
    replacement = replacement or {}

    def make_hook(layer: int):
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # [n, pos, head, d_head]
            return gated_z(z, gates[:, layer], replacement.get(layer))

        return hook

    return [(site("z", l), make_hook(l)) for l in _gated_layers(gates, after)]


def _gated_layers(gates: torch.Tensor, after: int = -1) -> list[int]:
    """Layers after `after` whose gates [n, L, H] are not all 1 (or that need a gradient)."""
    return [l for l in range(after + 1, gates.shape[1]) if gates.requires_grad or not bool((gates[:, l] == 1).all())]


def encoder_hidden(model, tokens: torch.Tensor, fwd: list, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Final hidden states [n, pos, d_model] of an encoder under extra hooks `fwd`.

    HookedModel.forward stops after the last block, skipping TransformerLens's random MLM head.
    """
    with model.hooks(fwd=fwd):
        return model(tokens, attention_mask=attention_mask)


def evaluate_masks(
    model, scorer: Scorer, masks: torch.Tensor, *, replacement: dict[int, torch.Tensor] | None = None,
    max_tokens: int | None = None, memory_budget: int | None = None, progress: bool = False, desc: str = "masks",
    per_example: bool = False,
) -> torch.Tensor:
    """Mean metric of the model under each mask: masks [k, n_layers, n_heads] -> [k] (float64);
    per_example=True: each example's metric instead, [k, n_examples] (float64, the same passes: the
    sweep engine returns per-example values, which the default sums).

    Each mask is a run of the sweep engine (execution/sweep.py): copies of the example batch
    stacked along the batch axis, as many per forward pass as the memory budget allows (halved on
    out-of-memory; examples are split when one copy per pass does not fit). Mask 1 keeps a head,
    0 removes it (zero, or `replacement` values: layer -> [batch or 1, pos, head, d_head] over all
    examples). For last-position decoder metrics each mask resumes at the first block where it
    differs from a reference mask (the all-ones mask if there is one, else masks[0]), from one
    captured pass under it (execution/resume.py). Under torch.distributed each rank scores its
    block of examples; the sums are all-reduced, so every rank returns the mean over all examples
    (per_example: each rank fills its block of a zero [k, n] table before the all-reduce).
    """
    n, pos = scorer.tokens.shape
    mine = distributed.shard(n)
    size = sweep.ChunkSize(batching.rows_per_pass(model, pos, max_tokens=max_tokens, memory_budget=memory_budget,
                                                  logits_cap=True))  # rows per pass, shared by both loops
    k, n_layers = masks.shape[0], model.facts.n_layers
    masks = masks.to(model.device)
    bar = tqdm(total=len(mine) * k, desc=desc, disable=not (progress and distributed.is_main()), leave=False)
    ones = (masks == 1).flatten(1).all(1).nonzero().flatten()
    ref = masks[ones[0]] if len(ones) else masks[0]  # [L, H] the reference the captured pass runs under
    differs = (masks != ref).flatten(2).any(2)  # [k, L]
    first = torch.where(differs.any(1), differs.float().argmax(1), n_layers).tolist()  # n_layers: equal to ref
    order = sorted(range(k), key=first.__getitem__) if scorer.last_position else list(range(k))  # runs by block

    def run_examples(ex: range) -> torch.Tensor:  # -> [k] metric sums over these examples ([k, b] per_example)
        rows = torch.arange(mine.start + ex.start, mine.start + ex.stop, device=model.device)  # [b]
        b = rows.shape[0]
        rep = None if replacement is None else {l: (v if v.shape[0] == 1 else v[rows]) for l, v in replacement.items()}

        def hooks_for(runs: range) -> list:  # masks order[runs] over the b examples, copy-major
            return gate_hooks(masks[order[runs.start:runs.stop]].repeat_interleave(b, 0), rep)

        def metric(out: torch.Tensor) -> torch.Tensor:  # [c * b, ...] -> [c * b]
            return scorer.metric(out, rows.repeat(out.shape[0] // b))

        spec = sweep.Sweep(
            tokens=scorer.tokens[rows], hooks_for=hooks_for, metric=metric, stacked_metric=True,
            attention_mask=None if scorer.attention_mask is None else scorer.attention_mask[rows],
            layer_of=(lambda run: first[order[run]]) if scorer.last_position else None,
            capture_hooks=gate_hooks(ref.expand(b, -1, -1), rep), dtype=torch.float64)
        values, _ = sweep.run(model, spec, range(k), lambda n_pos: size, done=lambda c: bar.update(c * b))  # [k, b]
        if per_example:
            out = torch.zeros(k, b, dtype=torch.float64)
            out[order] = values.double()
            return out
        sums = torch.zeros(k, dtype=torch.float64)
        sums[order] = values.sum(1)  # [k]
        return sums

    with torch.no_grad():
        if per_example:
            table = torch.zeros(k, n, dtype=torch.float64)  # [k, n] other ranks' blocks stay 0 until the all-reduce
            for ex, part in batching.run_chunks(run_examples, len(mine), max(1, min(len(mine), size.rows))):
                table[:, mine.start + ex.start: mine.start + ex.stop] = part
            bar.close()
            return distributed.all_reduce_sum(table)
        totals = torch.zeros(k, dtype=torch.float64)
        for _, part in batching.run_chunks(run_examples, len(mine), max(1, min(len(mine), size.rows))):
            totals += part
    bar.close()
    return distributed.all_reduce_sum(totals) / n


def ablation_values(model, scorer: Scorer, method: str, *, seed: int = 0) -> dict[int, torch.Tensor] | None:
    """What an ablated head's z becomes, per layer: None (zero); the per-position mean over the
    task's examples [1, pos, head, d_head] (mean); or another example's z [batch, pos, head,
    d_head] (resample: example i takes example partner[i] != i at every layer, seeded; the
    pairing of hooks.interventions.resample_partners, as hs.ablate's). With padding, positions
    are the padded batch's (left padding: counted back from each row's last token) and only real
    tokens count: the mean at a position is over the rows that have a token there, and a
    resampled row takes that mean where its partner is shorter than itself (the partner has only
    padding there, whose z depends on the attention backend's handling of fully masked rows)."""
    if method not in ABLATIONS:
        raise ConfigError(f"Unknown ablation method {method!r}; use one of {ABLATIONS}.")
    if method == "zero":
        return None
    names = [site("z", l) for l in range(model.facts.n_layers)]
    acts = capture(model, scorer.tokens, names, attention_mask=scorer.attention_mask)
    real = None if scorer.attention_mask is None else scorer.attention_mask.to(model.device).bool()  # [batch, pos]
    means = {l: _real_mean(acts[name], real) for l, name in enumerate(names)}  # [1, pos, head, d_head]
    if method == "mean":
        return means
    n = len(scorer)
    if n < 2:
        raise ConfigError("resample ablation needs a task of at least 2 examples to take activations from.")
    partner = resample_partners(n, n, torch.Generator().manual_seed(seed)).to(model.device)  # [batch], never itself
    if real is None:
        return {l: acts[name][partner] for l, name in enumerate(names)}
    has = real[partner][:, :, None, None]  # [batch, pos, 1, 1] the partner has a real token there
    return {l: torch.where(has, acts[name][partner], means[l]) for l, name in enumerate(names)}


def _real_mean(z: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """z [batch, pos, head, d_head] -> [1, pos, head, d_head]: the mean over rows, real tokens
    only (real [batch, pos] or None); 0 at a position no row has a token at."""
    if real is None:
        return z.mean(0, keepdim=True)
    w = real[:, :, None, None]  # [batch, pos, 1, 1]
    total = torch.where(w, z, 0.0).sum(0, keepdim=True)  # where, not *: padded z must not leak (NaN * 0)
    return total / w.sum(0, keepdim=True).clamp_min(1).to(z.dtype)


@dataclass(frozen=True)
class AblationScores:
    importance: torch.Tensor  # [L, H] baseline - ablated metric (NaN where not measured)
    metric: torch.Tensor  # [L, H] mean metric with the head ablated
    baseline: float  # mean metric with no extra head ablated (under base_mask)
    se: torch.Tensor | None = None  # [L, H] standard error over examples of the importance (NaN: not measured or n < 2)
    effects: torch.Tensor | None = None  # [L, H, n_examples] each example's drop (NaN: not measured), for paired tests


def ablation_importance(
    model, task: Task | torch.Tensor | Scorer, *, method: str = "zero", heads: list[tuple[int, int]] | None = None,
    base_mask: torch.Tensor | None = None, seed: int = 0, max_tokens: int | None = None, progress: bool = False,
) -> AblationScores:
    """Metric drop when each head alone is ablated, many heads per forward pass; `se`: its standard
    error over examples, sd(baseline_i - ablated_i) / sqrt(n) (each example's drop, from the same passes).

    heads: which (layer, head) to score (default all not removed by base_mask). base_mask
    [L, H]: heads already pruned (0, zeroed) in every copy, e.g. during iterative pruning.
    """
    scorer = make_scorer(model, task)
    f = model.facts
    base = torch.ones(f.n_layers, f.n_heads) if base_mask is None else base_mask.detach().float().cpu()
    if heads is None:
        heads = [(l, h) for l in range(f.n_layers) for h in range(f.n_heads) if base[l, h] > 0]
    for layer, head in heads:
        model.check_head(layer, head)
    masks = base.expand(len(heads) + 1, -1, -1).clone()  # [1 + k, L, H]; copy 0 is the baseline
    for i, (layer, head) in enumerate(heads):
        masks[i + 1, layer, head] = 0.0
    rep = ablation_values(model, scorer, method, seed=seed)
    if rep is not None and base_mask is not None:  # already-pruned heads are zeroed, not replaced
        keep = base.to(model.device)  # [L, H]
        rep = {l: v * keep[l].view(1, 1, -1, 1) for l, v in rep.items()}
    values = evaluate_masks(model, scorer, masks, replacement=rep, max_tokens=max_tokens, progress=progress,
                            desc=f"{method} ablation", per_example=True)  # [1 + k, n_examples], the same passes
    means = values.mean(1)  # [1 + k]
    effects = values[:1] - values[1:]  # [k, n_examples] each example's drop with the head ablated
    n = values.shape[1]
    spread = effects.std(1) / n ** 0.5 if n > 1 else torch.full((len(heads),), float("nan"), dtype=torch.float64)
    metric = torch.full((f.n_layers, f.n_heads), float("nan"), dtype=torch.float64)
    se = metric.clone()
    per = torch.full((f.n_layers, f.n_heads, n), float("nan"), dtype=torch.float64)  # [L, H, n]
    for i, (layer, head) in enumerate(heads):
        metric[layer, head] = means[i + 1]
        se[layer, head] = spread[i]
        per[layer, head] = effects[i].double()
    baseline = float(means[0])
    return AblationScores(importance=baseline - metric, metric=metric, baseline=baseline, se=se, effects=per)


def gradient_importance(
    model, task: Task | torch.Tensor | Scorer, *, normalize: bool = False, gates: torch.Tensor | None = None,
    max_tokens: int | None = None, progress: bool = False,
) -> torch.Tensor:
    """Michel et al.'s importance E_x |dL(x)/dxi_h| for every head: [n_layers, n_heads].

    One forward and one backward pass per batch of examples, all heads together. `gates`
    [L, H] is the point where the gradient is taken (default all 1; 0 for pruned heads).
    normalize: divide by the L2 norm within each layer (Michel et al.). Only the gates get
    gradients (torch.autograd.grad), so the model's parameters and .grad stay untouched.
    """
    scorer = make_scorer(model, task)
    importance, _ = gate_gradients(model, scorer, gates, max_tokens=max_tokens, progress=progress)
    return normalize_per_layer(importance) if normalize else importance


def gate_gradients(model, scorer: Scorer, gates: torch.Tensor | None = None, *, max_tokens: int | None = None,
                   memory_budget: int | None = None, progress: bool = False) -> tuple[torch.Tensor, float]:
    """(E_x |dL(x)/dxi| [L, H], mean metric at the gates) from the same forward passes."""
    stats = gate_gradient_stats(model, scorer, gates, max_tokens=max_tokens, memory_budget=memory_budget,
                                progress=progress)
    return stats.importance, stats.metric


@dataclass(frozen=True)
class GradientStats:
    """Gate-gradient importance with what the same passes give besides."""

    importance: torch.Tensor  # [L, H] float32 E_x |dL(x)/dxi|
    se: torch.Tensor  # [L, H] float64 sd_x |dL(x)/dxi| / sqrt(n) (NaN below 2 examples)
    metric: float  # mean metric at the gates
    loss_size: float  # E_x |L(x)|, the differentiated loss's size (its rounding floor: metrics.noise_floor)
    examples: torch.Tensor  # [L, H, n] float64 each example's own |dL(x)/dxi| (the paired tests between heads)


def gate_gradient_stats(model, scorer: Scorer, gates: torch.Tensor | None = None, *, max_tokens: int | None = None,
                        memory_budget: int | None = None, progress: bool = False) -> GradientStats:
    """Each example's |dL(x)/dxi_h| for every head, and their mean and standard error, from one forward and one
    backward pass per batch: the gates have a batch axis (xi [b, L, H], each row its example's own copy), and as
    examples do not interact, the gradient of the summed loss in xi[b] is example b's own gradient, exactly.

    Batches are sized for a backward pass and halved on out-of-memory; under torch.distributed
    each rank fills its block of examples and the tables are all-reduced.
    """
    f = model.facts
    point = torch.ones(f.n_layers, f.n_heads) if gates is None else gates.detach().float()
    n, pos = scorer.tokens.shape
    mine = distributed.shard(n)
    batch = max(1, min(len(mine), batching.rows_per_pass(model, pos, max_tokens=max_tokens, grad=True,
                                                         memory_budget=memory_budget, logits_cap=True)))
    bar = tqdm(total=len(mine), desc="gate gradients", disable=not (progress and distributed.is_main()), leave=False)

    def step(ex: range) -> tuple[torch.Tensor, torch.Tensor]:  # -> ([b, L H] |grad|, [2] sums of metric and |loss|)
        rows = torch.arange(mine.start + ex.start, mine.start + ex.stop, device=model.device)  # [b]
        xi = point.to(model.device).expand(rows.shape[0], -1, -1).clone().requires_grad_(True)  # [b, L, H]
        out = run_gated(model, scorer.tokens[rows], xi, last_only=scorer.last_position,
                        attention_mask=None if scorer.attention_mask is None else scorer.attention_mask[rows])
        loss = scorer.grad_loss(out, rows)  # [b]
        (grad,) = torch.autograd.grad(loss.sum(), [xi])  # [b, L, H] row b: example b's own dL/dxi
        bar.update(rows.shape[0])
        with torch.no_grad():  # an encoder's masked-LM head has parameters that want gradients
            metric = scorer.metric(out.detach(), rows).sum().double().cpu()
        size = loss.detach().double().abs().sum().cpu()
        return grad.double().abs().flatten(1).cpu(), torch.stack([metric, size])

    k = f.n_layers * f.n_heads
    table = torch.zeros(n, k, dtype=torch.float64)  # [n, L H] other ranks' rows stay 0 until the all-reduce
    sums = torch.zeros(2, dtype=torch.float64)
    with torch.enable_grad():
        for ex, (part, totals) in batching.run_chunks(step, len(mine), batch):
            table[mine.start + ex.start: mine.start + ex.stop] = part
            sums += totals
    bar.close()
    table, sums = distributed.all_reduce_sum(table), distributed.all_reduce_sum(sums)
    mean = table.mean(0)  # [L H]
    se = table.std(0) / n ** 0.5 if n > 1 else torch.full((k,), float("nan"), dtype=torch.float64)
    return GradientStats(importance=mean.view(f.n_layers, f.n_heads).float(), se=se.view(f.n_layers, f.n_heads),
                         metric=float(sums[0]) / n, loss_size=float(sums[1]) / n,
                         examples=table.T.reshape(f.n_layers, f.n_heads, n))


def readout_size(model, scorer: Scorer, *, max_tokens: int | None = None) -> float:
    """The size of the numbers the metric is computed from, E_x max_v |logit_v| at the scored positions
    (decoders; the mean over positions where every position is scored), from one plain pass: a logit
    difference or log-probability is rounded relative to the logits it subtracts, not to its own value
    (a logit difference of 0.2 between logits of 5 carries the rounding of 5). Encoders (the cosine of
    unit vectors, temperature-1 contrastive loss): 1; an encoder scored at its mask: the masked-LM head's logits
    there. Sets the heads rounding floors (metrics.noise_floor)."""
    return readout_stats(model, scorer, max_tokens=max_tokens)[0]


def readout_stats(model, scorer: Scorer, *, max_tokens: int | None = None) -> tuple[float, float | None]:
    """(readout_size, the answer's sensitivity E_x sum_t (1 - p_t)) from one plain pass; the sensitivity is None
    without answer tokens (cosine encoders, text, a Scorer built by hand). A log-probability's derivative in logit v is
    [v = answer] - p_v, so rounding every logit to its nearest float (an error of at most half a step) moves log p
    by at most one step x (1 - p) (half for the answer's own logit, half through the normaliser, sum_v!=a p_v =
    1 - p), summed over the answer's tokens: a saturated answer (p = 0.993) carries 1/150 of the logits' rounding
    step (review 11b A2), an unlikely one all of it."""
    if scorer.kind == "cosine" or (model.facts.is_encoder and scorer.read is None):
        return 1.0, None
    n, pos = scorer.tokens.shape
    ones = torch.ones(1, model.facts.n_layers, model.facts.n_heads)
    batch = max(1, min(n, batching.rows_per_pass(model, pos, max_tokens=max_tokens, logits_cap=True)))
    answers = scorer.answers

    def step(ex: range) -> torch.Tensor:  # -> [2]: sum of max |logit|, sum of the answers' sum (1 - p)
        rows = torch.arange(ex.start, ex.stop, device=model.device)  # [b]
        out = run_gated(model, scorer.tokens[rows], ones.expand(len(rows), -1, -1), last_only=scorer.last_position,
                        attention_mask=None if scorer.attention_mask is None else scorer.attention_mask[rows])
        out = out if scorer.read is None else scorer.read(out, rows)  # an encoder's: the head's at the mask
        size = out.detach().abs().amax(-1).double().mean(-1).sum().cpu()  # [b, q, vocab] -> one sum
        if answers is None:
            return torch.stack([size, torch.zeros((), dtype=torch.float64)])
        p = metrics.answer_logprob_per_token(out.detach(), answers[rows]).double().exp()  # [b, k] (1 where padding)
        return torch.stack([size, (1 - p).sum().cpu()])

    with torch.no_grad():
        total = sum(part for _, part in batching.run_chunks(step, n, batch))
    return float(total[0]) / n, None if answers is None else float(total[1]) / n


def normalize_per_layer(importance: torch.Tensor, exponent: float = 2.0) -> torch.Tensor:
    """importance [L, H] divided by its L-`exponent` norm within each layer (Michel et al.)."""
    norm = importance.abs().pow(exponent).sum(-1, keepdim=True).pow(1.0 / exponent)  # [L, 1]
    return importance / (norm + 1e-20)
