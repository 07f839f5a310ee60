"""The `attribution` analysis: is attention an explanation? (Jain & Wallace 2019)

For each example it scores every input token for the model's prediction by several methods:
attention (per layer and head, the head mean per layer, the last layer), attention rollout,
saliency, gradient x input and integrated gradients (Captum, on the token embeddings), and
leave-one-out (the output change when the token is removed). It then ranks the tokens by each
method and measures agreement with Kendall's tau, leaving out the first and last tokens (BOS /
[CLS], or the prompt's own first token where none was put in front, and the query token /
[SEP]); and it permutes the attention weights of one layer to see
how much the output depends on them.

Decoders: the prediction is the next token at the last position; gradients differentiate the
task metric (logit difference, or log-probability), leave-one-out and permutations measure the
TVD of the next-token distribution. Where the output is saturated (the top token's p >= 0.99 on
most examples, permutation.saturation, decided on the clean runs before scoring) a distribution
distance cannot move, so leave-one-out then scores each token by the absolute change of the logit
difference when it is left out (`loo_metric`), as the permutation test's finding falls back to the
metric's change; with a log-probability metric it stays the TVD (log p of a near-certain answer is
as blind) and the finding says its tau rests on a saturated distance. A masked LM whose task's prompts each hold one
mask token and give one-token answers (analyses/core/mask_read.py, as heads) is scored as a decoder with its answer
read at the mask through the checkpoint's masked-LM head: gradients, leave-one-out, permutations and the adversarial
search read the mask's logits, attention and rollout the mask's row, and the mask itself is left out of every ranking
(the query, as a decoder's last token; leaving it out would remove the question). Other encoders (MiniLM): the
prediction is the mean-pooled
embedding; gradients differentiate its cosine similarity to a reference embedding (by default
the next sentence's, so gradients say which tokens make the sentence close to its partner; at
the sentence's own embedding the cosine is maximal and its gradient vanishes), leave-one-out and
permutations measure 1 - cosine to the unmodified embedding. A partner cosine at that ceiling (>= 0.99, two
prompts of one label where the embedding encodes it) is the encoder's saturation: the summary's
partner_ceiling counts those examples, as `saturated` counts a decoder's (summary.partner_ceiling).

Padded Tasks (decoders left-padded, encoders right-padded): each example is scored on its real
tokens only, in batches of equal real length, and draws its random permutations and adversarial
noise from a generator seeded by its own tokens, so its scores, taus and permutation results are
those of the example run alone; padding gets no score and takes no part in any ranking. The
scores table's positions are in the Task's padded coordinates (as its spans). The scores table
ranks the tokens between the first and the last (normalised, non-negative); the token_scores table
holds every token's raw gradient scores (integrated gradients signed), what `hs.show_tokens` draws.

The inputs (real tokens, baselines, the metric's targets) are inputs.py's; the summary, with its keys, summary.py's.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from headscope.analyses.attribution import methods as am
from headscope.analyses.attribution.adversarial import adversarial_attention
from headscope.analyses.attribution.agreement import method_pair_rows, tau_rows
from headscope.analyses.attribution.convergence import completeness_error, ig_convergence
from headscope.analyses.attribution.inputs import (
    baseline_choice,
    example_generator,
    gradient_targets,
    ig_baselines,
    length_groups,
    metric_kind,
    read_positions,
    real_spans,
    real_tokens,
)
from headscope.analyses.attribution.permutation import permute_attention, saturation
from headscope.analyses.attribution.rounding import float32_fits, measured_floor
from headscope.analyses.attribution.summary import _summary, attention_window, rounding_summary, tau_tables
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import ENCODER_SCORING, Needs, Reads
from headscope.analyses.core.mask_read import mask_metric, mask_read
from headscope.analyses.core.metrics import answer_logprob, logit_diff
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task, sentence_task, shipped_sentences
from headscope.errors import ConfigError, TaskError, UnsupportedModelError
from headscope.execution import batching, distributed
from headscope.hooks import expert_layout
from headscope.models.hooked_model import layer_windows, visible_keys

METHODS = ("saliency", "grad_x_input", "integrated_gradients", "leave_one_out")


# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=True, what="attributes the answer's score to the input tokens")
ENCODER_METRIC = ("cosine of each prompt's mean-pooled embedding with the next sampled prompt's (the last prompt's "
                  "with the first's), which saliency, gradient x input and integrated gradients differentiate with "
                  "respect to the embedding layer's output at each token (word + position + token-type embeddings, "
                  "after the embedding LayerNorm); leave-one-out and permutations: 1 - cosine to the prompt's "
                  "own unmodified embedding")


def reads(model, config: Any = None, summary: Any = None) -> Reads:
    """What attribution reads of a task (contract.Reads): decoders the prompts and answers, each prompt
    alone; a masked LM whose summary says it was scored at its mask (mask_read) the same, read there; other encoders
    the prompts only, scored against their sampled partner's pooled embedding."""
    read = summary.get("mask_read") if isinstance(summary, dict) else None
    if model.facts.is_encoder and isinstance(read, dict):
        return Reads(why="attribution scores each prompt alone", metric=mask_metric(read))
    if model.facts.is_encoder:
        return Reads(answers=False, why=ENCODER_SCORING, metric=ENCODER_METRIC)
    return Reads(why="attribution scores each prompt alone")


@dataclass(frozen=True, kw_only=True)
class AttributionConfig(AnalysisConfig):
    """Settings of the attribution analysis.

    n_steps: integration steps of integrated gradients, doubled (up to ig_max_steps) until every
    example's |convergence delta| <= ig_tolerance x |metric(x) - metric(baseline)|.
    loo_mode: "remove" the token (Jain & Wallace) or "replace" it by the baseline token.
    baseline_token: id for IG baselines and "replace" (None: the first of pad, unk, eos, bos
    whose embedding is not near zero). permutation_layer: None = last; the adversarial attention
    search runs there too (adversarial_steps Adam steps, 0 = off; output change <= adversarial_epsilon).
    batch_size: at most this many sequences per forward pass without gradients (leave-one-out and
    permutation variants) and batch_size // n_steps examples per integrated-gradients group; fewer
    where memory holds fewer (execution.batching.rows_per_pass), which also sizes IG's (example,
    step) rows per forward and backward pass.
    metric: what gradients differentiate (None: the task's; "accuracy" falls back to "logprob").
    """

    n_steps: int = 32
    ig_max_steps: int = 256
    ig_tolerance: float = 0.05
    loo_mode: str = "remove"
    baseline_token: int | None = None
    permutation_layer: int | None = None
    n_permutations: int = 100
    adversarial_steps: int = 100
    adversarial_epsilon: float = 0.01
    batch_size: int = 256
    alpha: float = 0.05
    metric: str | None = None

    QUICK: ClassVar[dict[str, Any]] = {"n_steps": 8, "ig_max_steps": 32, "n_permutations": 20, "adversarial_steps": 20}

    @classmethod
    def preset(cls, *, quick: bool = False, **common) -> AttributionConfig:
        if not quick:  # the report's full run searches adversarial attention for 50 steps
            config = cls(adversarial_steps=50, **common)
            object.__setattr__(config, "_given", config.given - {"adversarial_steps"})  # the preset's, not the caller's
            return config
        return cls(quick=True, **common)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loo_mode not in ("remove", "replace"):
            raise ConfigError(f"loo_mode must be 'remove' or 'replace', got {self.loo_mode!r}.")
        for name in ("n_steps", "ig_max_steps", "n_permutations", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.adversarial_steps < 0 or self.adversarial_epsilon <= 0:
            raise ConfigError("adversarial_steps must be >= 0 and adversarial_epsilon > 0, got "
                             f"{self.adversarial_steps} and {self.adversarial_epsilon}.")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"alpha must lie in (0, 1), got {self.alpha}.")


# ---- the analysis ---------------------------------------------------------------------------------
@takes_prompt
@names_source
def attribution(
    model,
    task: Task | str | None = None,
    config: AttributionConfig | None = None,
    *,
    reference: torch.Tensor | None = None,
    **config_overrides: Any,
) -> Result:
    """Token importance by attention, rollout, gradients, IG and leave-one-out, and their agreement.

    task: a Task, a zoo task name or task file, or None (default_task). config_overrides are
    fields of AttributionConfig (n_steps=16, progress=True). reference (data, not a setting): [batch, d_model] embeddings
    for the encoder metric (default: each sentence's partner). Returns a Result whose df has one
    row per (example, attention vector, method) with Kendall tau; tables: scores, tau_methods,
    tau_summary, tau_by_layer, tau_by_head, permutation, ig.
    """
    cfg = configure(AttributionConfig, config, config_overrides, name="attribution")
    if not isinstance(task, Task):
        task = default_task(model, task, cfg)
    setup = _setup(model, task, cfg, reference)
    groups = list(length_groups(setup.lengths, setup.chunk))
    parts: tuple[list, ...] = ([], [], [], [], [], [], [], [])  # score frames, tau, pairs, perm, IG, tokens, LOO & gxi floors
    for g in tqdm(distributed.shard(len(groups)), desc="attribution",
                  disable=not (cfg.progress and distributed.is_main())):
        for part, rows in zip(parts, _score_group(model, task, groups[g], cfg, setup)):  # each rank: its block of groups
            part.extend(rows)
    gathered = distributed.gather_objects(parts)  # rank order = group order
    score_rows, tau, pairs, perm_rows, ig_rows, token_rows, loo_rows, gxi_rows = (
        [row for part in gathered for row in part[i]] for i in range(8))
    df = pd.DataFrame(tau).astype({"layer": "Int64", "head": "Int64"})
    ig_table = pd.DataFrame(ig_rows)
    convergence = ig_convergence(ig_table, dtype=str(model.dtype).removeprefix("torch."), routing=top_k_routing(model),
                                 max_steps=max(cfg.n_steps, cfg.ig_max_steps))
    tables = {
        "scores": pd.concat(score_rows, ignore_index=True),
        "tau_methods": pd.DataFrame(pairs),
        **tau_tables(df, convergence),
        "permutation": pd.DataFrame(perm_rows),
        "ig": ig_table,
        "token_scores": pd.concat(token_rows, ignore_index=True),
        **({"loo_rounding": pd.DataFrame(loo_rows).sort_values("example", ignore_index=True)} if loo_rows else {}),
        "gradient_rounding": pd.DataFrame(gxi_rows).sort_values("example", ignore_index=True),
    }
    gradient_rounding = rounding_summary(tables["gradient_rounding"])
    summary = _summary(df, tables, convergence, kind=setup.kind, cfg=cfg, layer=setup.layer,
                       encoder=model.facts.is_encoder and setup.at is None, gradient_rounding=gradient_rounding)
    if setup.at is not None:  # review 15c B1: a masked LM scored at its mask, as heads records it
        summary["mask_read"] = mask_read(model, task, setup.at)
    summary["loo_metric"] = setup.loo_metric
    if setup.baseline_note:  # review 19a C1: the baseline IG and "replace" use is not a special token, and why
        summary["baseline_note"] = setup.baseline_note
    summary["gradient_input"] = am.gradient_input(model)  # what saliency & co. are taken against (13c C6)
    if loo_rows:
        summary["loo_rounding"] = rounding_summary(tables["loo_rounding"])
    summary["gradient_rounding"] = gradient_rounding  # review 18e A1: gradient x input within its rounding floor
    if setup.saturated is not None:  # the record leave-one-out's metric was decided on (the same clean runs)
        summary["saturated"] = setup.saturated
    summary.update(attention_window(tables["scores"], layer_windows(model)[-1]))
    config_out = {**dataclasses.asdict(cfg), "baseline_token": setup.baseline, "permutation_layer": setup.layer,
                  "task": task.name}
    return Result(name="attribution", df=df, summary=summary, tables=tables, config=config_out)


@dataclass(frozen=True)
class _Setup:
    """What every group of examples shares: the metric, its gradient targets, the baseline token, the
    permutation layer and the pass sizes."""

    kind: str
    forward: Any  # am.forward_metric: (tokens, *targets) -> [g]
    targets: tuple
    baseline: int
    layer: int
    spans: list[tuple[int, int]]
    lengths: list[int]
    grad_rows: int  # IG's (example, step) rows per forward and backward pass
    rows: int  # leave-one-out's and the permutations' variants per pass
    chunk: int  # examples per group
    saturated: dict | None  # decoders: permutation.saturation of the clean runs' top-token probabilities
    loo_metric: str  # what leave-one-out scores: "tvd", "1-cosine" or "logit_diff" (loo_metric)
    at: torch.Tensor | None = None  # [batch] a masked LM's mask among each example's real tokens (read_positions)
    baseline_note: str | None = None  # inputs.baseline_choice: no special token's embedding would do (review 19a C1)
    measure_gradient: bool = False  # re-run gradient x input in float32 for its rounding floor (rounding.float32_fits)


def top_k_routing(model: Any) -> dict[str, Any] | None:
    """{"layers": the mixture-of-experts layers, "top_k": k (None where the router does not say)}, None on a model
    without routing: where the router's top-k choice jumps along IG's path (ig_convergence)."""
    moe = {}
    for layer in range(model.facts.n_layers):
        try:
            layout = expert_layout(model, layer)
        except UnsupportedModelError:  # a mixture layout hooks.memories does not read: not named, never fatal here
            continue
        if layout is not None:
            moe[layer] = layout
    if not moe:
        return None
    ks = {lay.top_k for lay in moe.values()}
    return {"layers": sorted(moe), "top_k": ks.pop() if len(ks) == 1 else None}


def _setup(model, task: Task, cfg: AttributionConfig, reference: torch.Tensor | None) -> _Setup:
    layer = model.facts.n_layers - 1 if cfg.permutation_layer is None else model.check_layer(cfg.permutation_layer)
    spans = real_spans(task)
    lengths = [n for _, n in spans]
    if min(lengths) < 4:
        raise ConfigError("attribution needs examples of at least 4 tokens (first and last are left out of the ranking).")
    at = None if cfg.metric == "cosine" else read_positions(model, task, spans)  # [batch] or None
    kind = metric_kind(model, task, cfg, at_mask=at is not None)
    forward = am.forward_metric(model, kind, at_mask=at is not None)
    targets = gradient_targets(model, task, kind, reference, spans)
    baseline, note = (cfg.baseline_token, None) if cfg.baseline_token is not None else baseline_choice(model)
    # rows a pass may hold at the longest length (the engines' sizing rule): IG's (example, step) rows
    # with a backward pass, leave-one-out's and the permutations' variants without
    grad_rows = batching.rows_per_pass(model, max(lengths), grad=True)
    rows = min(cfg.batch_size, batching.rows_per_pass(model, max(lengths)))
    saturated = (None if model.facts.is_encoder and at is None
                 else saturation(clean_top_probs(model, task, spans, rows, at)))
    return _Setup(kind=kind, forward=forward, targets=targets, baseline=baseline, layer=layer, spans=spans,
                  lengths=lengths, grad_rows=grad_rows, rows=rows,
                  chunk=max(1, min(cfg.batch_size // cfg.n_steps, grad_rows // 2)),
                  saturated=saturated, loo_metric=loo_metric(model, kind, saturated, at_mask=at is not None), at=at,
                  baseline_note=note, measure_gradient=float32_fits(model))


@torch.no_grad()
def clean_top_probs(model, task: Task, spans: Sequence[tuple[int, int]], rows: int,
                    at: torch.Tensor | None = None) -> list[float]:
    """Each example's clean top next-token probability (its real tokens alone; a masked LM's at its mask `at`
    [batch]), in task order: what permutation.saturation decides on, known before any method runs so leave-one-out
    can follow it."""
    top = [0.0] * len(task)
    for idx in length_groups([n for _, n in spans], rows):
        where = None if at is None else at[idx].to(model.device)  # [g]
        probs = am.prediction(model, model(real_tokens(task, idx, spans).to(model.device)), where)  # [g, vocab]
        for i, p in zip(idx, probs.max(-1).values.tolist()):
            top[i] = p
    return top


def loo_metric(model, kind: str, saturated: dict | None, at_mask: bool = False) -> str:
    """What leave-one-out measures: 1 - cosine (encoders); the TVD of the next-token distribution,
    unless any output is saturated (`saturated`, permutation.saturation: n_saturated) and the task metric is the
    logit difference: then a TVD cannot move (review 9a A5) and the change of the logit difference is
    used, as the permutation test's finding does. A log-probability of a near-certain answer is as
    blind as the TVD, so with that metric the TVD stays and the finding says so. A masked LM scored at its mask
    (at_mask) follows the decoders' rule, its distribution read at the mask."""
    if model.facts.is_encoder and not at_mask:
        return "1-cosine"
    if kind == "logit_diff" and saturated is not None and (saturated.get("n_saturated") or 0) > 0:
        return "logit_diff"  # review 10b A4: one saturated example's TVD ranks noise, so not only when most are
    return "tvd"


def _score_group(model, task: Task, idx: list[int], cfg: AttributionConfig, setup: _Setup) -> tuple[list, ...]:
    """Every method on one group of equal-length examples -> (score frames, tau rows, method-pair rows,
    permutation rows, IG rows, token frames, leave-one-out rounding rows (loo_rounding; none unless it is scored
    by the logit difference), gradient x input rounding rows (gradient_rounding))."""
    n, spans, baseline, layer, forward = setup.lengths[idx[0]], setup.spans, setup.baseline, setup.layer, setup.forward
    tokens = real_tokens(task, idx, spans).to(model.device)  # [g, pos], padding dropped
    generator = [example_generator(cfg.seed, row) for row in tokens]  # the same draws on any rank, in any batch
    tgt = tuple(t[idx] for t in setup.targets)
    at = None if setup.at is None else setup.at[idx].to(model.device)  # [g] a masked LM's masks, else None
    args = tgt if at is None else (at, *tgt)  # forward's targets (forward_metric: the mask first)
    scored = list(range(1, n - 1))
    windows = layer_windows(model)
    per_head, roll = am.attention_scores(model, tokens, at)  # [g, layer, head, pos], [g, pos]
    grads = am.gradient_scores(model, tokens, forward, args, at)
    if setup.measure_gradient:  # review 19e A1: the floor measured by a float32 re-run, not the worst-case bound
        grads["grad_x_input_floor"] = measured_floor(model, tokens, forward, args, grads["grad_x_input_signed"], at)
    gxi_ranked, gxi_rows = gradient_rounding(grads, idx, model.dtype, at, measured=setup.measure_gradient)
    ig, delta, steps, delta_half = am.integrated_gradients(
        model, tokens, ig_baselines(tokens, baseline, at), forward, args,
        n_steps=cfg.n_steps, max_steps=max(cfg.n_steps, cfg.ig_max_steps), tolerance=cfg.ig_tolerance,
        internal_batch_size=setup.grad_rows)
    score = _score(setup.kind, tgt)
    loo, clean = am.leave_one_out_with_clean(model, tokens, scored, mode=cfg.loo_mode, baseline_token=baseline,
                                             batch_size=setup.rows, score=score if setup.loo_metric == "logit_diff" else None,
                                             at=at)
    # loo [g, pos - 2]; clean [g, vocab]: the clean run's last logits it was measured against, the rounding floor's
    loo, loo_rows = loo_rounding(model, tokens, loo, idx, tgt, clean) if setup.loo_metric == "logit_diff" else (loo, [])
    permuted = permute_attention(model, tokens, layer=layer, n_permutations=cfg.n_permutations, batch_size=setup.rows,
                                 generator=generator, score=score, at=at)
    changes, max_att = permuted.change, permuted.max_attention
    adv = None if not cfg.adversarial_steps else adversarial_attention(
        model, tokens, layer=layer, epsilon=cfg.adversarial_epsilon, steps=cfg.adversarial_steps, generator=generator,
        score=score, at=at)
    with torch.no_grad():
        f_x = forward(tokens, *args)  # [g]
        f_b = forward(ig_baselines(tokens, baseline, at), *args)  # [g]
    score_rows, tau, pairs, perm_rows, ig_rows, token_rows = [], [], [], [], [], []
    visible: dict | None = None  # window_starts: the same for every example of the group (its keys, windows and n)
    for j, ex in enumerate(idx):
        # the ranked tokens: 1..n-2, less a masked LM's mask (its query, left out as a decoder's last token)
        keep = [i for i, p in enumerate(scored) if at is None or p != int(at[j])]  # indices into scored
        ranked = [scored[i] for i in keep]
        methods = {
            "saliency": grads["saliency"][j, 1:-1], "grad_x_input": gxi_ranked[j, 1:-1],
            "integrated_gradients": ig[j, 1:-1].abs(), "leave_one_out": loo[j].abs(),
        }
        methods = {k: _distribution(v[keep]) for k, v in methods.items()}
        attention = _attention_vectors(per_head[j, :, :, 1:-1][..., keep], roll[j, 1:-1][keep])
        if visible is None:
            visible = window_starts(attention, windows, n)
        tau.extend(tau_rows(ex, attention, methods, alpha=cfg.alpha, visible_from=visible))
        pairs.extend(method_pair_rows(ex, methods, alpha=cfg.alpha))
        score_rows.append(_score_frame(model, ex, tokens[j], ranked, attention, methods, offset=spans[ex][0],
                                       visible_from=visible))
        token_rows.append(_token_frame(model, ex, tokens[j], {
            "saliency": grads["saliency"][j], "grad_x_input": grads["grad_x_input"][j],
            "integrated_gradients": ig[j]}, offset=spans[ex][0]))
        perm_rows.append({
            "example": ex, "layer": layer, "max_attention": float(max_att[j]),
            "median_change": float(changes[j].median()), "mean_change": float(changes[j].mean()),
            "change_dtype": str(changes.dtype).removeprefix("torch."),  # what the change was computed in (its rounding)
            **({} if permuted.top_prob is None else {"top_prob": float(permuted.top_prob[j])}),
            **({} if permuted.metric_change is None else {
                "metric_change": float(permuted.metric_change[j].mean()),
                "abs_metric_change": float(permuted.metric_change[j].abs().mean())}),
            **({} if adv is None else {"adversarial_jsd": float(adv.jsd[j]), "adversarial_change": float(adv.change[j]),
                                       "adversarial_found": bool(adv.feasible[j])}),
            **({} if adv is None or adv.metric_change is None else
               {"adversarial_metric_change": float(adv.metric_change[j])}),
        })
        ig_rows.append({
            "example": ex, "n_steps": int(steps[j]), "attribution_sum": float(ig[j].sum()), "delta": float(delta[j]),
            "delta_half": float(delta_half[j]),  # at n_steps / 2 (NaN: none ran): did doubling still shrink the miss
            "metric_input": float(f_x[j]), "metric_baseline": float(f_b[j]),
            "relative_error": completeness_error(float(ig[j].sum()), float(f_x[j]), float(f_b[j])),
        })
    return score_rows, tau, pairs, perm_rows, ig_rows, token_rows, loo_rows, gxi_rows


def gradient_rounding(grads: dict[str, torch.Tensor], idx: list[int], dtype: torch.dtype,
                      at: torch.Tensor | None = None, measured: bool = False) -> tuple[torch.Tensor, list[dict]]:
    """|gradient x input| [g, pos] with the scores within their rounding floor grads["grad_x_input_floor"] set to 0,
    ties (review 18e A1: in bfloat16 the bfloat16 ranking agreed with float32's at tau 0.62-0.75), and per example its
    record over the ranked tokens (1..pos-2, less a masked LM's mask `at` [g]): example, dtype, floor (the largest
    token floor), floor_kind ("measured": rounding.measured_floor's float32 re-run; "bound": methods.gradient_floor's
    worst case), n_scores, n_within_floor."""
    score, floor = grads["grad_x_input"], grads["grad_x_input_floor"]  # [g, pos] each
    within = score <= floor
    ranked = am.ranked_tokens(*score.shape, at, score.device)  # [g, pos]
    name = str(dtype).removeprefix("torch.")
    kind = "measured" if measured else "bound"
    rows = [{"example": ex, "dtype": name, "floor": float(floor[j][ranked[j]].max()), "floor_kind": kind,
             "n_scores": int(ranked[j].sum()),
             "n_within_floor": int((within[j] & ranked[j]).sum())} for j, ex in enumerate(idx)]
    return score.masked_fill(within, 0.0), rows


@torch.no_grad()
def loo_rounding(model, tokens: torch.Tensor, loo: torch.Tensor, idx: list[int],
                 targets: tuple, clean: torch.Tensor | None = None) -> tuple[torch.Tensor, list[dict]]:
    """Leave-one-out's changes of the logit difference [g, m] with those within one rounding step of the clean
    logits (methods.logit_rounding_floor, in the model's dtype) set to 0, ties (review 10a A1: in bfloat16 at a
    logit difference of 7.7 the changes are a few rounding steps, 16 of 38 exactly 0, and a tau over them ranks
    rounding), and per example its record: example, dtype, floor (logits), n_scores, n_within_floor. clean: the clean
    run's last-position logits [g, vocab] in the model's dtype where leave-one-out's own clean run gave them
    (leave_one_out_with_clean); None: one clean forward here."""
    if clean is None:
        clean = model(tokens)[:, -1]  # [g, vocab] in the model's dtype: what the logit difference is read from
    floor = am.logit_rounding_floor(clean, *targets)  # [g]
    tied, within = am.tie_rounding(loo.float().cpu(), floor.cpu())  # [g, m] each
    dtype = str(clean.dtype).removeprefix("torch.")
    rows = [{"example": ex, "dtype": dtype, "floor": float(floor[j]), "n_scores": int((~loo[j].isnan()).sum()),
             "n_within_floor": int(within[j].sum())} for j, ex in enumerate(idx)]
    return tied, rows


def _score(kind: str, targets: tuple) -> Any:
    """The task metric of last-position logits for given examples of a group (permutation.Score), the
    one gradients differentiate; None for encoders (their output is an embedding, not a distribution)."""
    if kind == "logit_diff":
        answers, wrong = targets
        return lambda logits, ex: logit_diff(logits, answers[ex], wrong[ex])
    if kind == "logprob":
        return lambda logits, ex: answer_logprob(logits, targets[0][ex])
    return None


def _distribution(scores: torch.Tensor) -> np.ndarray:
    """Non-negative scores over the ranked tokens, normalised to sum 1 (all zero stays zero)."""
    s = scores.detach().float().clamp_min(0).cpu().numpy()
    total = s.sum()
    return s / total if total > 0 else s


def _attention_vectors(per_head: torch.Tensor, roll: torch.Tensor) -> dict[tuple, np.ndarray]:
    """per_head [layer, head, m], roll [m] -> {(kind, layer, head): distribution over the m tokens}."""
    n_layers, n_heads, _ = per_head.shape
    out: dict[tuple, np.ndarray] = {}
    for layer in range(n_layers):
        for head in range(n_heads):
            out[("head", layer, head)] = _distribution(per_head[layer, head])
        out[("layer_mean", layer, None)] = _distribution(per_head[layer].mean(0))
    out[("last_layer", n_layers - 1, None)] = out[("layer_mean", n_layers - 1, None)]
    out[("rollout", None, None)] = _distribution(roll)
    return out


def window_starts(attention: dict, windows: Sequence[int | None], n: int) -> dict:
    """Per attention vector of a sliding-window layer (models.layer_windows), the index among the ranked
    tokens (positions 1..n-2) of the first one the answer query (position n - 1) sees (models.visible_keys);
    absent when all are seen."""
    out = {}
    ranked = torch.arange(1, n - 1)  # [n - 2] positions of the ranked tokens
    for key in attention:
        kind, layer = key[0], key[1]
        window = windows[layer] if kind != "rollout" and layer is not None else None
        if window:
            first = int(visible_keys(n - 1, ranked, window).to(torch.int64).argmax())
            if first > 0:
                out[key] = first
    return out


def _score_frame(model, example: int, tokens: torch.Tensor, positions: list[int], attention: dict, methods: dict,
                 offset: int = 0, visible_from: dict | None = None) -> pd.DataFrame:
    """Long table of one example's scores: example, position (in the Task's padded coordinates, as
    its spans: offset + the position among the real tokens), token, method, layer, head, score, masked
    (True: an attention score the layer's sliding window sets to 0 by construction, window_starts)."""
    strs = model.to_str_tokens(tokens)
    frames = []
    for key, scores in attention.items():
        kind, layer, head = key
        name = "attention" if kind == "head" else kind
        frames.append((name, layer, head, scores, (visible_from or {}).get(key, 0)))
    frames.extend((method, None, None, scores, 0) for method, scores in methods.items())
    rows = [
        {"example": example, "position": offset + p, "token": strs[p], "method": name, "layer": layer, "head": head,
         "score": float(s), "masked": i < start}
        for name, layer, head, scores, start in frames
        for i, (p, s) in enumerate(zip(positions, scores))
    ]
    return pd.DataFrame(rows).astype({"layer": "Int64", "head": "Int64"})


def _token_frame(model, example: int, tokens: torch.Tensor, scores: dict[str, torch.Tensor], offset: int = 0) -> pd.DataFrame:
    """Every token of one example (the first and last too) with each gradient method's raw score:
    example, position, token, method, score; integrated gradients keeps its sign (the scores sum to
    the metric's change from the baseline), saliency and |gradient x input| are magnitudes."""
    strs = model.to_str_tokens(tokens)
    rows = [{"example": example, "position": offset + p, "token": strs[p], "method": name, "score": float(v)}
            for name, values in scores.items() for p, v in enumerate(values.detach().float().cpu().tolist())]
    return pd.DataFrame(rows)


# ---- default tasks and the registry entry point ------------------------------------------------------
def default_task(model, task: str | None = None, config: AttributionConfig | None = None) -> Task:
    """`task` (a zoo task name or task file); None: the shipped sentences for encoders, the zoo "kv"
    task for zoo models, and for other decoders the IOI task over the tokenizer's single-token names
    (default_tasks.ioi_task; the shipped sentences where there are too few)."""
    from headscope.analyses.core import default_tasks
    from headscope.analyses.core.task_files import resolve_task

    config = config or AttributionConfig()
    n = config.examples(64, 4)
    if model.facts.is_encoder and task is None:
        return sentence_task(model, shipped_sentences()[:n])
    if task is None:
        return default_tasks.zoo_or(model, "kv", lambda: _ioi_or_sentences(model, n, config.seed), n, config.seed)
    return resolve_task(model, task, default="kv", n_examples=n, seed=config.seed)


def _ioi_or_sentences(model, n: int, seed: int) -> Task:
    from headscope.analyses.core import default_tasks

    try:
        return default_tasks.ioi_task(model, n, seed)
    except TaskError:  # too few single-token names
        return sentence_task(model, shipped_sentences()[:n])


def run(model, task: Task | str | None = None, config: AttributionConfig | None = None) -> Result:
    """The whole analysis on `task` (see default_task for None); same as attribution()."""
    return attribution(model, task, config or AttributionConfig.preset())
