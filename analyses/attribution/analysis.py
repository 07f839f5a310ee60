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
as blind) and the finding says its tau rests on a saturated distance. Encoders (MiniLM): the prediction is the mean-pooled
embedding; gradients differentiate its cosine similarity to a reference embedding (by default
the next sentence's, so gradients say which tokens make the sentence close to its partner; at
the sentence's own embedding the cosine is maximal and its gradient vanishes), leave-one-out and
permutations measure 1 - cosine to the unmodified embedding.

Padded Tasks (decoders left-padded, encoders right-padded): each example is scored on its real
tokens only, in batches of equal real length, and draws its random permutations and adversarial
noise from a generator seeded by its own tokens, so its scores, taus and permutation results are
those of the example run alone; padding gets no score and takes no part in any ranking. The
scores table's positions are in the Task's padded coordinates (as its spans). The scores table
ranks the tokens between the first and the last (normalised, non-negative); the token_scores table
holds every token's raw gradient scores (integrated gradients signed), what `hs.show_tokens` draws.

Summary keys (attention = the last layer's head mean): loo_metric (what leave-one-out's scores measure:
"tvd", "1-cosine" or, on a saturated output with a logit-difference task, "logit_diff"); loo_rounding (with
"logit_diff": the changes within one rounding step of the clean logits in the model's dtype, methods.logit_rounding_floor,
are ties at 0 before ranking; dtype, floor [min, max] in logits, n_within of n_scores, ranks_rounding when most are;
per example the loo_rounding table); mean_tau_attention_{gradient,
saliency, loo, ig} with std_tau_*, frac_significant_* and n_tau_*; the same for rollout (mean_tau_rollout_*, ...); rollout_vs_raw
({gradient, loo, ig}: the per-example paired difference tau(rollout) - tau(last layer) against that reference:
mean, sd, n, ci (95% t), p (paired t) and p_holm, Holm-corrected over the three); fraction_significant (over
all four pairs); mean_tau_gradient_loo and mean_tau_ig_loo (agreement among the baselines);
attention_window (a sliding-window last layer that hides ranked tokens from the answer query: every attention
vector of a windowed layer is ranked, against each method, only over the tokens inside its window; the scores
table marks the others `masked`); median_permutation_tvd (median over examples of the median output change over permutations);
saturated (decoders: the share of examples whose clean top token has p >= 0.99, the median 1 - p and the
most TVD a one-logit change can give there, permutation.saturation, of the clean runs loo_metric is decided on);
permutation_metric_change and
permutation_abs_metric_change (the task metric's change under the permutations, in its units: per
example the mean over draws of the signed and the absolute change; the mean over examples, with _sd and _n);
adversarial_metric_change (the same at the adversarial attention);
ig_max_abs_delta, ig_max_relative_delta and ig_max_steps_used (IG convergence); ig_converged (every example's
completeness error |sum attributions - (f(x) - f(baseline))| / |f(x) - f(baseline)|, the ig table's relative_error,
is within ig_error_tolerance 0.1), ig_n_converged, ig_n_not_converged, ig_median_relative_error and ig_worst (its
example, sum and change), ig_dtype (the precision its gradients ran in); ig_used and ig_examples_used
(convergence.py's rule: IG on every example, on the converged
ones only, or on none; every IG key above (taus, rollout_vs_raw's ig, fraction_significant, mean_tau_ig_loo) and the
tau_summary, tau_by_layer and tau_by_head tables hold only those examples; the per-example tables keep every row);
permutation_abs_metric_change_ci (seeded percentile bootstrap over examples); best_head_vs_loo;
median_adversarial_jsd and fraction_adversarial_near_ln2 (JSD >= 0.9 ln 2 with the output change
<= adversarial_epsilon; Jain & Wallace's adversarial attention).
"""
from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from headscope.analyses.attribution import methods as am
from headscope.analyses.attribution.adversarial import LN2, adversarial_attention
from headscope.analyses.attribution.agreement import method_pair_rows, paired_differences, summarise, tau_rows
from headscope.analyses.attribution.convergence import IgUse, completeness_error, ig_convergence, ig_use
from headscope.analyses.attribution.permutation import permute_attention, saturation
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import ENCODER_SCORING, Needs, Reads, one_token_answers
from headscope.analyses.core.metrics import answer_logprob, logit_diff, mean_pool
from headscope.analyses.core.result import Result
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task, sentence_task, shipped_sentences
from headscope.errors import ConfigError, TaskError
from headscope.execution import batching, distributed
from headscope.models.hooked_model import layer_windows

METHODS = ("saliency", "grad_x_input", "integrated_gradients", "leave_one_out")
SUMMARY_NAMES = {"grad_x_input": "gradient", "saliency": "saliency", "leave_one_out": "loo", "integrated_gradients": "ig"}
# the references the finding compares rollout with raw attention against (Holm corrects over these three)
ROLLOUT_REFERENCES = ("grad_x_input", "leave_one_out", "integrated_gradients")


# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=True, what="attributes the answer's score to the input tokens")
ENCODER_METRIC = ("cosine of each prompt's mean-pooled embedding with the next sampled prompt's (the last prompt's "
                  "with the first's); leave-one-out and permutations: 1 - cosine to the prompt's "
                  "own unmodified embedding")


def reads(model, config: Any = None, summary: Any = None) -> Reads:
    """What attribution reads of a task (contract.Reads): decoders the prompts and answers, each prompt
    alone; encoders the prompts only, scored against their sampled partner's pooled embedding."""
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


# ---- inputs -----------------------------------------------------------------------------------
def real_spans(task: Task) -> list[tuple[int, int]]:
    """(start, length) of each example's real tokens in task.tokens: left padding (decoders), right
    padding (encoders) or none. Padded examples are scored on their real tokens only, grouped by
    length, so every example's scores are those of the example run alone."""
    n = task.tokens.shape[1]
    if task.attention_mask is None:
        return [(0, n)] * len(task)
    mask = task.attention_mask.bool().cpu()  # [batch, pos]
    lengths = mask.sum(1)  # [batch]
    starts = mask.int().argmax(1)  # [batch] first real token
    pos = torch.arange(n)[None, :]  # [1, pos]
    if not torch.equal((pos >= starts[:, None]) & (pos < (starts + lengths)[:, None]), mask):
        raise TaskError("attribution needs each example's real tokens in one run (attention_mask 0...0 1...1 "
                        "or 1...1 0...0).")
    return list(zip(starts.tolist(), lengths.tolist()))


def real_tokens(task: Task, idx: Sequence[int], spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[len(idx), n]: the real tokens of examples `idx`, all of one length n, padding dropped."""
    n = spans[idx[0]][1]
    return torch.stack([task.tokens[i, spans[i][0] : spans[i][0] + n] for i in idx])


def example_generator(seed: int, tokens: torch.Tensor) -> torch.Generator:
    """A generator seeded by `seed` and the example's own tokens [pos]: its random draws
    (permutations, adversarial noise) do not depend on which examples share its batch, its index or
    the padding, so an example scored in a data set draws what it draws alone."""
    digest = zlib.crc32(tokens.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes())
    return torch.Generator().manual_seed(seed * 100_003 + digest)


def length_groups(lengths: Sequence[int], chunk: int) -> Iterator[list[int]]:
    """Example indices grouped by equal length, in chunks of at most `chunk`."""
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    for idx in by_length.values():
        for start in range(0, len(idx), chunk):
            yield idx[start : start + chunk]


MIN_BASELINE_NORM = 0.5  # a baseline embedding needs at least this fraction of the median norm


def default_baseline_token(model) -> int:
    """The first of pad, unk, eos, bos whose input embedding is not near zero.

    Why not near zero: a pad embedding is often exactly 0 (HF zeroes padding_idx and it is
    never trained) and rare specials decay towards 0. The first norm layer is scale-invariant,
    so on the straight path from 0 the model's output jumps within a tiny interval next to the
    baseline, and integrated gradients cannot converge there (the delta stays at
    f(x) - f(baseline) whatever the number of steps). Any token with a normal-sized embedding
    avoids that; candidates are tried in the usual order of "content-free" tokens.
    """
    tok = model.tokenizer
    cands = [int(c) for c in (tok.pad_token_id, tok.unk_token_id, tok.eos_token_id, tok.bos_token_id) if c is not None]
    if not cands:
        raise ConfigError("The tokenizer has no pad, unk, eos or bos token; pass baseline_token= explicitly.")
    weight = model.bridge.original_model.get_input_embeddings().weight.detach()  # [vocab, d_model]
    norms = weight.float().norm(dim=-1)  # [vocab]
    floor = MIN_BASELINE_NORM * float(norms.median())
    for cand in cands:
        if cand < norms.shape[0] and float(norms[cand]) >= floor:
            return cand
    raise ConfigError(
        f"Every special token ({cands}) has a near-zero input embedding (norm < {MIN_BASELINE_NORM} x the median), "
        "which makes integrated gradients diverge; pass baseline_token= a content-free token with a normal embedding.")


def ig_baselines(tokens: torch.Tensor, baseline_token: int) -> torch.Tensor:
    """[batch, pos]: every token but the first and last replaced by the baseline token."""
    out = tokens.clone()
    out[:, 1:-1] = baseline_token
    return out


@torch.no_grad()
def partner_references(model, task: Task, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[batch, d_model]: for sentence i, the pooled embedding of sentence (i + 1) mod batch (real tokens only)."""
    if len(task) < 2:
        raise ConfigError("The encoder metric compares each sentence with another one; give at least 2 sentences or reference=.")
    pooled = torch.stack([mean_pool(model(real_tokens(task, [i], spans)), None)[0] for i in range(len(task))])  # [batch, d]
    return pooled.roll(-1, dims=0)


def gradient_targets(model, task: Task, kind: str, reference: torch.Tensor | None,
                     spans: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    """Per-example tensors the metric needs, in forward_metric's argument order."""
    if kind == "cosine":
        ref = reference if reference is not None else partner_references(model, task, spans)
        return (ref.to(model.device),)
    one_token_answers(task, "attribution")
    answers = task.answers.to(model.device)
    if kind == "logprob":
        return (answers,)
    if task.wrong_answers is None:
        raise ConfigError(f"Task {task.name!r} has no wrong_answers for logit_diff; pass metric='logprob'.")
    return answers, task.wrong_answers.to(model.device)


def metric_kind(model, task: Task, cfg: AttributionConfig) -> str:
    """What gradients differentiate: "cosine" for encoders; the task's metric (or cfg.metric) for decoders."""
    if model.facts.is_encoder:
        if cfg.metric not in (None, "cosine"):
            raise ConfigError(f"Encoders have no next-token logits; metric must be 'cosine' (or None), got {cfg.metric!r}.")
        return "cosine"
    kind = cfg.metric or task.metric
    if kind == "cosine":
        raise ConfigError("The cosine metric is for encoders; use 'logit_diff' or 'logprob' for a decoder.")
    return "logprob" if kind == "accuracy" else kind


# ---- the analysis ---------------------------------------------------------------------------------
@takes_prompt
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
    parts: tuple[list, ...] = ([], [], [], [], [], [], [])  # score frames, tau, pairs, permutation, IG, tokens, LOO floor
    for g in tqdm(distributed.shard(len(groups)), desc="attribution",
                  disable=not (cfg.progress and distributed.is_main())):
        for part, rows in zip(parts, _score_group(model, task, groups[g], cfg, setup)):  # each rank: its block of groups
            part.extend(rows)
    gathered = distributed.gather_objects(parts)  # rank order = group order
    score_rows, tau, pairs, perm_rows, ig_rows, token_rows, loo_rows = (
        [row for part in gathered for row in part[i]] for i in range(7))
    df = pd.DataFrame(tau).astype({"layer": "Int64", "head": "Int64"})
    ig_table = pd.DataFrame(ig_rows)
    dtype = next((p.dtype for p in model.bridge.parameters() if p.is_floating_point()), None)
    convergence = ig_convergence(ig_table, dtype=None if dtype is None else str(dtype).removeprefix("torch."))
    tables = {
        "scores": pd.concat(score_rows, ignore_index=True),
        "tau_methods": pd.DataFrame(pairs),
        **tau_tables(df, convergence),
        "permutation": pd.DataFrame(perm_rows),
        "ig": ig_table,
        "token_scores": pd.concat(token_rows, ignore_index=True),
        **({"loo_rounding": pd.DataFrame(loo_rows).sort_values("example", ignore_index=True)} if loo_rows else {}),
    }
    summary = _summary(df, tables, convergence, kind=setup.kind, cfg=cfg, layer=setup.layer,
                       encoder=model.facts.is_encoder)
    summary["loo_metric"] = setup.loo_metric
    if loo_rows:
        summary["loo_rounding"] = rounding_summary(tables["loo_rounding"])
    if setup.saturated is not None:  # the record leave-one-out's metric was decided on (the same clean runs)
        summary["saturated"] = setup.saturated
    summary.update(attention_window(tables["scores"], layer_windows(model)[-1]))
    config_out = {**dataclasses.asdict(cfg), "baseline_token": setup.baseline, "permutation_layer": setup.layer,
                  "task": task.name}
    return Result(name="attribution", df=df, summary=summary, tables=tables, config=config_out)


def rounding_summary(rows: pd.DataFrame) -> dict[str, Any]:
    """The summary's loo_rounding from the per-example table: dtype, floor [min, max] over examples (logits),
    n_within (scores within it, ties), n_scores, and ranks_rounding: most scores are within it, so leave-one-out's
    tau would rank rounding and the finding leaves it out of its claims."""
    n_within, n_scores = int(rows.n_within_floor.sum()), int(rows.n_scores.sum())
    return {"dtype": str(rows.dtype.iloc[0]), "floor": [float(rows.floor.min()), float(rows.floor.max())],
            "n_within": n_within, "n_scores": n_scores, "ranks_rounding": 2 * n_within > n_scores}


def tau_tables(df: pd.DataFrame, convergence: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """tau_summary, tau_by_layer and tau_by_head from the tau rows (`df`), integrated gradients' only on the examples
    convergence.py's rule keeps (`convergence`: ig_convergence's record); the per-example df keeps every row."""
    used = ig_use({**convergence, "n_examples": int(df.example.nunique())}).rows(df)
    return {"tau_summary": summarise(used, ["attention", "method"]),
            "tau_by_layer": summarise(used[used.attention == "layer_mean"], ["layer", "method"]),
            "tau_by_head": summarise(used[used.attention == "head"], ["layer", "head", "method"])}


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


def _setup(model, task: Task, cfg: AttributionConfig, reference: torch.Tensor | None) -> _Setup:
    layer = model.facts.n_layers - 1 if cfg.permutation_layer is None else model.check_layer(cfg.permutation_layer)
    spans = real_spans(task)
    lengths = [n for _, n in spans]
    if min(lengths) < 4:
        raise ConfigError("attribution needs examples of at least 4 tokens (first and last are left out of the ranking).")
    kind = metric_kind(model, task, cfg)
    forward = am.forward_metric(model, kind)
    targets = gradient_targets(model, task, kind, reference, spans)
    baseline = cfg.baseline_token if cfg.baseline_token is not None else default_baseline_token(model)
    # rows a pass may hold at the longest length (the engines' sizing rule): IG's (example, step) rows
    # with a backward pass, leave-one-out's and the permutations' variants without
    grad_rows = batching.rows_per_pass(model, max(lengths), grad=True)
    rows = min(cfg.batch_size, batching.rows_per_pass(model, max(lengths)))
    saturated = None if model.facts.is_encoder else saturation(clean_top_probs(model, task, spans, rows))
    return _Setup(kind=kind, forward=forward, targets=targets, baseline=baseline, layer=layer, spans=spans,
                  lengths=lengths, grad_rows=grad_rows, rows=rows,
                  chunk=max(1, min(cfg.batch_size // cfg.n_steps, grad_rows // 2)),
                  saturated=saturated, loo_metric=loo_metric(model, kind, saturated))


@torch.no_grad()
def clean_top_probs(model, task: Task, spans: Sequence[tuple[int, int]], rows: int) -> list[float]:
    """Each example's clean top next-token probability (its real tokens alone), in task order: what
    permutation.saturation decides on, known before any method runs so leave-one-out can follow it."""
    top = [0.0] * len(task)
    for idx in length_groups([n for _, n in spans], rows):
        probs = am.prediction(model, model(real_tokens(task, idx, spans).to(model.device)))  # [g, vocab]
        for i, p in zip(idx, probs.max(-1).values.tolist()):
            top[i] = p
    return top


def loo_metric(model, kind: str, saturated: dict | None) -> str:
    """What leave-one-out measures: 1 - cosine (encoders); the TVD of the next-token distribution,
    unless any output is saturated (`saturated`, permutation.saturation: n_saturated) and the task metric is the
    logit difference: then a TVD cannot move (review 9a A5) and the change of the logit difference is
    used, as the permutation test's finding does. A log-probability of a near-certain answer is as
    blind as the TVD, so with that metric the TVD stays and the finding says so."""
    if model.facts.is_encoder:
        return "1-cosine"
    if kind == "logit_diff" and saturated is not None and (saturated.get("n_saturated") or 0) > 0:
        return "logit_diff"  # review 10b A4: one saturated example's TVD ranks noise, so not only when most are
    return "tvd"


def _score_group(model, task: Task, idx: list[int], cfg: AttributionConfig, setup: _Setup) -> tuple[list, ...]:
    """Every method on one group of equal-length examples -> (score frames, tau rows, method-pair rows,
    permutation rows, IG rows, token frames, leave-one-out rounding rows (loo_rounding; none unless it is scored
    by the logit difference))."""
    n, spans, baseline, layer, forward = setup.lengths[idx[0]], setup.spans, setup.baseline, setup.layer, setup.forward
    tokens = real_tokens(task, idx, spans).to(model.device)  # [g, pos], padding dropped
    generator = [example_generator(cfg.seed, row) for row in tokens]  # the same draws on any rank, in any batch
    tgt = tuple(t[idx] for t in setup.targets)
    scored = list(range(1, n - 1))
    windows = layer_windows(model)
    per_head, roll = am.attention_scores(model, tokens)  # [g, layer, head, pos], [g, pos]
    grads = am.gradient_scores(model, tokens, forward, tgt)
    ig, delta, steps = am.integrated_gradients(
        model, tokens, ig_baselines(tokens, baseline), forward, tgt,
        n_steps=cfg.n_steps, max_steps=max(cfg.n_steps, cfg.ig_max_steps), tolerance=cfg.ig_tolerance,
        internal_batch_size=setup.grad_rows)
    score = _score(setup.kind, tgt)
    loo = am.leave_one_out(model, tokens, scored, mode=cfg.loo_mode, baseline_token=baseline, batch_size=setup.rows,
                           score=score if setup.loo_metric == "logit_diff" else None)  # [g, pos - 2]
    loo, loo_rows = loo_rounding(model, tokens, loo, idx, tgt) if setup.loo_metric == "logit_diff" else (loo, [])
    permuted = permute_attention(model, tokens, layer=layer, n_permutations=cfg.n_permutations, batch_size=setup.rows,
                                 generator=generator, score=score)
    changes, max_att = permuted.change, permuted.max_attention
    adv = None if not cfg.adversarial_steps else adversarial_attention(
        model, tokens, layer=layer, epsilon=cfg.adversarial_epsilon, steps=cfg.adversarial_steps, generator=generator,
        score=score)
    with torch.no_grad():
        f_x = forward(tokens, *tgt)  # [g]
        f_b = forward(ig_baselines(tokens, baseline), *tgt)  # [g]
    score_rows, tau, pairs, perm_rows, ig_rows, token_rows = [], [], [], [], [], []
    for j, ex in enumerate(idx):
        methods = {
            "saliency": grads["saliency"][j, 1:-1], "grad_x_input": grads["grad_x_input"][j, 1:-1],
            "integrated_gradients": ig[j, 1:-1].abs(), "leave_one_out": loo[j].abs(),
        }
        methods = {k: _distribution(v) for k, v in methods.items()}
        attention = _attention_vectors(per_head[j, :, :, 1:-1], roll[j, 1:-1])
        visible = window_starts(attention, windows, n)
        tau.extend(tau_rows(ex, attention, methods, alpha=cfg.alpha, visible_from=visible))
        pairs.extend(method_pair_rows(ex, methods, alpha=cfg.alpha))
        score_rows.append(_score_frame(model, ex, tokens[j], scored, attention, methods, offset=spans[ex][0],
                                       visible_from=visible))
        token_rows.append(_token_frame(model, ex, tokens[j], {
            "saliency": grads["saliency"][j], "grad_x_input": grads["grad_x_input"][j],
            "integrated_gradients": ig[j]}, offset=spans[ex][0]))
        perm_rows.append({
            "example": ex, "layer": layer, "max_attention": float(max_att[j]),
            "median_change": float(changes[j].median()), "mean_change": float(changes[j].mean()),
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
            "metric_input": float(f_x[j]), "metric_baseline": float(f_b[j]),
            "relative_error": completeness_error(float(ig[j].sum()), float(f_x[j]), float(f_b[j])),
        })
    return score_rows, tau, pairs, perm_rows, ig_rows, token_rows, loo_rows


@torch.no_grad()
def loo_rounding(model, tokens: torch.Tensor, loo: torch.Tensor, idx: list[int],
                 targets: tuple) -> tuple[torch.Tensor, list[dict]]:
    """Leave-one-out's changes of the logit difference [g, m] with those within one rounding step of the clean
    logits (methods.logit_rounding_floor, in the model's dtype) set to 0, ties (review 10a A1: in bfloat16 at a
    logit difference of 7.7 the changes are a few rounding steps, 16 of 38 exactly 0, and a tau over them ranks
    rounding), and per example its record: example, dtype, floor (logits), n_scores, n_within_floor."""
    clean = model(tokens)[:, -1]  # [g, vocab] in the model's dtype: what the logit difference is read from
    floor = am.logit_rounding_floor(clean, *targets)  # [g]
    tied, within = am.tie_rounding(loo.float().cpu(), floor.cpu())  # [g, m] each
    dtype = str(clean.dtype).removeprefix("torch.")
    rows = [{"example": ex, "dtype": dtype, "floor": float(floor[j]), "n_scores": int(loo.shape[1]),
             "n_within_floor": int(within[j].sum())} for j, ex in enumerate(idx)]
    return tied, rows


def bootstrap_mean_ci(values: np.ndarray, *, seed: int, n_boot: int = 2000, level: float = 0.95) -> list[float] | None:
    """Percentile bootstrap interval of the mean over examples (resampled with replacement, `seed`'s generator);
    None under 2 values. Used for means of absolute values, whose t interval can cross 0 where they cannot."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(1)  # [n_boot]
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


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
    tokens (positions 1..n-2) of the first one the answer query (position n - 1) sees: keys k > n - 1 - window
    (transformers' sliding_window_overlay), so position n - window on, index n - window - 1; 0 when all are seen."""
    out = {}
    for key in attention:
        kind, layer = key[0], key[1]
        window = windows[layer] if kind != "rollout" and layer is not None else None
        if window and n - window - 1 > 0:
            out[key] = n - window - 1
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


def attention_window(scores: pd.DataFrame, window: int | None) -> dict:
    """{"attention_window": ...} when the last layer's sliding window hides ranked tokens from the answer
    query (else {}): the window, how many ranked tokens its taus rank (min, max over examples) of how many
    ranked tokens there are, and in how many examples it cut."""
    last = scores[scores.method == "last_layer"]
    if not window or "masked" not in last or not last.masked.any():
        return {}
    hidden, total = last.groupby("example").masked.sum(), last.groupby("example").size()
    seen = total - hidden
    return {"attention_window": {"window": int(window), "ranked": [int(seen.min()), int(seen.max())],
                                 "of": [int(total.min()), int(total.max())], "n_examples_cut": int((hidden > 0).sum())}}


def _summary(df: pd.DataFrame, tables: dict, convergence: dict[str, Any], *, kind: str, cfg: AttributionConfig,
             layer: int, encoder: bool) -> dict:
    out: dict[str, Any] = {
        "attention": "last_layer", "metric": kind, "output_change": "1-cosine" if encoder else "tvd",
        "loo_mode": cfg.loo_mode, "n_examples": int(df.example.nunique()),
    }
    # IG's taus enter every claim only on the examples convergence.py's rule keeps (its converged ones, or none
    # when too few converge): the tau means, the paired rollout tests, the count of significant taus, IG vs LOO
    out.update(convergence)
    rule: IgUse = ig_use(out)
    df = rule.rows(df)
    summ = tables["tau_summary"].set_index(["attention", "method"])
    for att, prefix in (("last_layer", "attention"), ("rollout", "rollout")):
        for method, short in SUMMARY_NAMES.items():
            if (att, method) in summ.index:
                row = summ.loc[(att, method)]
                out[f"mean_tau_{prefix}_{short}"] = _num(row.mean_tau)
                out[f"std_tau_{prefix}_{short}"] = _num(row.std_tau)
                out[f"frac_significant_{prefix}_{short}"] = _num(row.frac_significant)
    # rollout against raw last-layer attention, paired per example, Holm over the references the finding names
    paired = paired_differences(df, list(ROLLOUT_REFERENCES))
    out["rollout_vs_raw"] = {SUMMARY_NAMES[m]: {k: v if k in ("n", "ci") else _num(v) for k, v in e.items()}
                             for m, e in paired.items()}
    last = df[(df.attention == "last_layer")].dropna(subset=["tau"])
    flow = df[(df.attention == "rollout")].dropna(subset=["tau"])
    for method, short in SUMMARY_NAMES.items():  # examples with a defined tau (a prompt too short to rank gives NaN)
        if (("last_layer", method)) in summ.index:
            out[f"n_tau_attention_{short}"] = int(last[last.method == method].example.nunique())
        if (("rollout", method)) in summ.index:
            out[f"n_tau_rollout_{short}"] = int(flow[flow.method == method].example.nunique())
    out["fraction_significant"] = _num(last.significant.mean()) if len(last) else None
    out["n_tau_tests"] = int(len(last))  # examples x methods used: the count the fraction is over
    pairs = rule.rows(rule.rows(tables["tau_methods"], "method_a"), "method_b")
    for a, b, key in (("grad_x_input", "leave_one_out", "gradient_loo"), ("integrated_gradients", "leave_one_out", "ig_loo")):
        sel = pairs[(pairs.method_a == a) & (pairs.method_b == b)].tau
        out[f"mean_tau_{key}"] = _num(sel.mean())
    out["median_permutation_tvd"] = _num(tables["permutation"].median_change.median())
    perm = tables["permutation"]  # (its saturation: the caller's, from the clean pre-pass leave-one-out follows)
    for column, key in (("metric_change", "permutation_metric_change"), ("abs_metric_change", "permutation_abs_metric_change"),
                        ("adversarial_metric_change", "adversarial_metric_change")):
        if column in perm:  # per-example means over draws, in the metric's units: their mean, sd and n
            values = perm[column].dropna()
            out[key] = _num(values.mean())
            out[f"{key}_sd"] = _num(values.std()) if len(values) > 1 else None
            out[f"{key}_n"] = int(len(values))
            if column == "abs_metric_change":  # a mean of |change| is >= 0: a bootstrap interval, not a t interval
                out[f"{key}_ci"] = bootstrap_mean_ci(values.to_numpy(), seed=cfg.seed)
    out["permutation_layer"] = layer
    out["n_permutations"] = cfg.n_permutations
    out["ig_max_abs_delta"] = _num(tables["ig"].delta.abs().max())
    if "adversarial_jsd" in perm:
        out["adversarial_epsilon"] = cfg.adversarial_epsilon
        out["median_adversarial_jsd"] = _num(perm.adversarial_jsd.median())
        out["fraction_adversarial_near_ln2"] = _num((perm.adversarial_jsd >= 0.9 * LN2).mean())
    ig = tables["ig"]
    out["ig_max_relative_delta"] = _num((ig.delta.abs() / (ig.metric_input - ig.metric_baseline).abs()).max())
    out["ig_max_steps_used"] = int(ig.n_steps.max())
    heads = tables["tau_by_head"]
    heads = heads[heads.method == "leave_one_out"].dropna(subset=["mean_tau"])
    if len(heads):
        best = heads.loc[heads.mean_tau.idxmax()]
        out["best_head_vs_loo"] = {"layer": int(best.layer), "head": int(best["head"]), "mean_tau": _num(best.mean_tau)}
    return out


def _num(x: Any) -> float | None:
    x = float(x)
    return None if np.isnan(x) else x


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
