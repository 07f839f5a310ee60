"""The `circuits` analysis, part 1 (issue #23): logit lens and direct logit attribution.

- logit_lens(model, task=None, config=None) -> Result: each block input read through the
  model's final norm (statistics recomputed per state, as TransformerLens 4.3's logit_lens) and
  unembedding, at every position up to the answer or at the answer position only (lens.py).
- direct_logit_attribution(model, task=None, config=None) -> Result: each embedding, head,
  attention bias, MLP, the final-norm bias and b_U along the answer's (or answer minus wrong
  answer's) unembedding direction at the answer position, with the final norm linearised at
  its actual, frozen scale; the rows sum to the final logit (difference) exactly (dla.py).
- run(model, task=None, config=None) -> Result: both from one pass per chunk of examples; with
  config.edges and a task with corrupted prompts, also edge attribution (EAP / EAP-IG, edges.py)
  and the exact faithfulness of top-k circuits against random ones (faithfulness.py): tables
  "edges" (the 200 strongest edges) and "faithfulness" (k, circuit, draw, metric, faithfulness),
  summary smallest_k_80, faithfulness_at_k, random_faithfulness_at_k, top_edges, MIB's CPR and CMD with
  their bootstrap intervals over examples (mib_cpr_ci, mib_cmd_ci, mib_n_examples), edges_parallel_blocks (each MLP
  reads its block's input: no same-layer head -> MLP edge; the graph figure draws it beside its heads), and
  edges_n_examples (the clean/corrupted pairs they ran on: a user's pair of two token lengths is left out, counted in
  pairs_left_out with its file row numbers in pairs_left_out_rows). On multi-head latent attention the edges are
  not run (summary edges_skipped, MLA_EDGES); the lens and DLA are.

Default task: the zoo "ioi" task on zoo models, IOI over the tokenizer's single-token names
on other decoders (repeated random tokens where there are too few); encoders are skipped by
`run` (summary {"skipped": reason}) and refused by the two named functions. Padded tasks (mixed
lengths, attention_mask) read each row at its own answer position and real tokens only, so every
example's rows equal those of the example run alone. Tables: "lens" (example, layer, stage,
position (0 = the prompt's first real token), target, is_answer, logprob, rank, logit_diff), "dla" (example,
component, kind, layer, head, contribution) and "dla_mean" (component, kind, layer, head,
contribution = mean over examples, std). Summary: per-layer mean
answer rank, log-probability, top-1 fraction (and its count of examples) and logit difference (with its 95% t interval
over the lens_logit_diff_n examples that have a wrong answer) at the answer position; the
first layer whose median answer rank is 0 (top-1 in at least half the examples); top components
and heads; each top component's mean, sd, 95% t interval and n over examples (dla_top_intervals)
and, for each pair of the three largest, the paired difference of their magnitudes with its
interval and whether it contains 0 (dla_top_differences: "tied", not ranked); the writers beyond the
three whose mean lies inside the third's interval (dla_last_named_ties; components 0 up to rounding on every
example, absent biases, are neither ranked nor tied: zero_components); all heads and all MLPs
summed per example, with mean, 95% t interval and n (dla_total_heads, dla_total_mlps); the sum of the
writers' contributions, the norm/bias terms and the final logit (difference) they reconstruct,
with the largest reconstruction error. A model that soft-caps its final logits (Gemma 2: cap * tanh(logits /
cap)) has no linear split of its capped output: the writers sum to the logit difference before the cap
(dla_logit_before_softcap, with dla_final_softcap the cap), dla_final_logit is the model's capped output, and
the reconstruction error is measured against the logit difference before the cap. dla_post_norms: the
writes that pass a norm of their own before the residual add ("post-attention", "post-MLP": OLMo 2, Gemma 2/3;
[] elsewhere), each head's read through that norm at its actual scale (dla.post_norms). Mixture-of-experts models
also get tables "dla_experts" (example, layer, expert, shared, routed, contribution) and "dla_experts_mean" (layer,
expert, shared, contribution, std, ci_low, ci_high, n, n_routed): each MoE block's DLA split by expert, summing to
its mlpN row (experts.py), and summary dla_top_expert (the top MoE block's leading expert against the next).
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from headscope import hooks
from headscope.analyses.circuits import dla as dla_mod
from headscope.analyses.circuits import experts as experts_mod
from headscope.analyses.circuits import lens as lens_mod
from headscope.analyses.circuits.edges import METHODS as EDGE_METHODS
from headscope.analyses.core import chance
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import Needs, Reads, one_token_answers
from headscope.analyses.core.metrics import noise_floor
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError, HeadscopeWarning, TaskError, UnsupportedModelError
from headscope.hooks import available_sites, run_with_cache
from headscope.models.readout import refuse_readout

LENS_POSITIONS = ("all", "answer")
NORM_CONVENTION = (
    "logit lens: ln_final applied to each accumulated residual with statistics recomputed from it "
    "(TransformerLens logit_lens); DLA: final norm linearised at the full stream's actual scale "
    "(ln_final.hook_scale, frozen), each write centred for LayerNorm, the norm weight folded into "
    "the direction, its bias and b_U as separate rows, value biases in attn_bias (TransformerLens "
    "direct_logit_attribution after enable_compatibility_mode); post-norm blocks (Gemma 2/3, OLMo 2): "
    "each head's write through the post-attention norm with its scale frozen at the whole attention output's"
)
_CHUNK_BYTES = 256 * 2**20  # a pass's output logits and captured states held at once


READOUT = "the logit lens and direct logit attribution"  # what post-LN blocks rule out (review 16d A4)
# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=True, decoder=True, what="reads next-token logits (logit lens, direct logit attribution)",
              linear_readout=READOUT)
# why edges stay off on MLA, in the finding's words ("... were not run: <this>")
MLA_EDGES = ("the model uses multi-head latent attention, whose heads' keys and values all come from one shared latent, "
             "so the edge graph's per-head k/v receivers do not exist; the logit lens and DLA above are unaffected.")


def reads(model, config: Any = None, summary: Any = None) -> Reads:
    """What circuits reads of a task (contract.Reads): the prompts and answers (lens, DLA) and, with edges on,
    the corrupted prompts (edge attribution and faithfulness patch between clean and corrupted runs)."""
    if config is None or getattr(config, "edges", True):
        return Reads(corrupted=True)
    return Reads(why="edge attribution and faithfulness, which patch them, are off (edges=False)")


@dataclass(frozen=True, kw_only=True)
class CircuitsConfig(AnalysisConfig):
    """lens_positions: "all" (every position up to the answer) or "answer". lens_target: "next"
    (the token after each position; the answer at the answer position) or "answer" (the task's
    answer everywhere). use_wrong_answer: DLA and the lens logit difference against the task's
    wrong answer when it has one (DLA along the answer alone otherwise). top_k: components listed
    in the summary. repeat_length: the repeated-random-tokens task of non-zoo decoders. edges: edge
    attribution and the faithfulness sweep in `run` (tasks with corrupted prompts). edge_method:
    "eap-ig" (default: Hanna et al. 2024 find its circuits more faithful than one-step EAP's),
    "eap-clean" (the papers' EAP baseline, gradient on the clean run; the quick preset's: one
    gradient pass, and the number published baselines report) or "eap-denoising"
    (TransformerLens's attribution_patch, gradient on the corrupted run); see edges.py. ig_steps:
    EAP-IG's steps (1 = eap-denoising). k_values: circuit sizes swept (None: about 10 from 1 to
    every edge, log-spaced)."""

    lens_positions: str = "all"
    lens_target: str = "next"
    use_wrong_answer: bool = True
    top_k: int = 10
    repeat_length: int = 12
    edges: bool = True
    edge_method: str = "eap-ig"
    ig_steps: int = 5
    k_values: tuple | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lens_positions not in LENS_POSITIONS:
            raise ConfigError(f"lens_positions must be one of {LENS_POSITIONS}, got {self.lens_positions!r}.")
        if self.lens_target not in lens_mod.TARGETS:
            raise ConfigError(f"lens_target must be one of {lens_mod.TARGETS}, got {self.lens_target!r}.")
        if self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {self.top_k}.")
        if self.ig_steps < 1:
            raise ConfigError(f"ig_steps must be >= 1, got {self.ig_steps}.")
        if self.edge_method not in EDGE_METHODS:
            raise ConfigError(f"edge_method must be one of {EDGE_METHODS}, got {self.edge_method!r}.")
        if self.k_values is not None and (not self.k_values or any(int(k) < 0 for k in self.k_values)):
            raise ConfigError(f"k_values must be a non-empty tuple of edge counts >= 0, got {self.k_values!r}.")

    QUICK: ClassVar[dict[str, Any]] = {"edge_method": "eap-clean", "ig_steps": 1}  # one-step clean-run EAP (the baseline)


# ---- tasks ---------------------------------------------------------------------------------
def default_task(model, task=None, config: CircuitsConfig | None = None) -> Task:
    """task as given (a Task, zoo task name, "repeat" or task data); None: the zoo "ioi" task on
    zoo models, else the IOI task over the tokenizer's single-token names, or repeated random
    tokens where there are too few (default_tasks.logit_diff_task)."""
    from headscope.analyses.core import default_tasks
    from headscope.analyses.core.task_files import resolve_task

    config = config or CircuitsConfig()
    n = config.examples(64, 8)
    if isinstance(task, str) and task == "repeat":
        return default_tasks.repeated_tokens_task(model, n, config.seed, length=config.repeat_length)
    if task is None:
        return default_tasks.zoo_or(
            model, "ioi", lambda: default_tasks.logit_diff_task(model, n, config.seed, repeat_length=config.repeat_length),
            n, config.seed)
    return resolve_task(model, task, default="ioi", n_examples=n, seed=config.seed)


def _refuse_encoder(model) -> None:
    """Encoders and post-LN blocks (review 16d A4: one line, before any work)."""
    if model.facts.is_encoder:
        raise ConfigError(f"the logit lens and DLA read next-token logits; {model.facts.name} is an encoder.")
    refuse_readout(model, READOUT)


def _check(model, task: Task) -> None:
    _refuse_encoder(model)
    if task.answers is None:
        raise TaskError(f"Task {task.name!r} has no answers; the logit lens and DLA need one answer token per prompt.")
    one_token_answers(task, "circuits")


# ---- the passes ----------------------------------------------------------------------------
def _chunks(model, task: Task):
    """Slices of examples whose pass holds about _CHUNK_BYTES: the output logits and the captured
    states (about four [pos, d_model] sites a layer); the lens reads its logits in bounded blocks."""
    f = model.facts
    per_row = 4 * task.tokens.shape[1] * (f.d_vocab + 4 * (f.n_layers + 1) * f.d_model)
    rows = max(1, min(len(task), _CHUNK_BYTES // per_row))
    for start in range(0, len(task), rows):
        yield slice(start, min(start + rows, len(task)))


def _collect(model, task: Task, config: CircuitsConfig, *, lens: bool, dla: bool):
    """(lens rows, DLA per-example rows, final logits, lens output error, direction name, per-expert DLA rows of
    the mixture-of-experts blocks or None: experts.expert_rows), one pass per chunk."""
    _check(model, task)
    available = set(available_sites(model)) | {"ln_final.hook_scale"}
    names = []
    if lens:
        names += lens_mod.lens_sites(model.facts.n_layers)
    experts = experts_mod.expert_sites(model) if dla else []  # MoE blocks' coefficients, at the answer only
    if dla:
        names += dla_mod.dla_sites(model, available) + experts
    names = list(dict.fromkeys(names))
    every = config.lens_positions == "all"
    wrong_all = task.wrong_answers if config.use_wrong_answer else None
    answer_pos, first_pos = task.answer_positions(), task.first_positions()
    labels = lens_mod.lens_labels(model.facts.n_layers)
    lens_frames, dla_frames, expert_frames, lens_err = [], [], [], 0.0
    for part in _chunks(model, task):
        tokens = task.tokens[part].to(model.device)
        mask = None if task.attention_mask is None else task.attention_mask[part].to(model.device)
        answers, pos = task.answers[part], answer_pos[part]
        read, slots = pos.unique(return_inverse=True)  # [n_read] answer positions, [rows] each row's among them
        with torch.no_grad():
            output, acts = run_with_cache(model, tokens, names, attention_mask=mask,
                                          site_positions={name: read.tolist() for name in experts})
        wrong = None if wrong_all is None else wrong_all[part]
        examples = torch.arange(part.start, part.stop)
        if lens:
            start = first_pos[part]
            positions, targets = lens_mod.lens_targets(task.tokens[part], answers, pos, config.lens_target, every,
                                                       start=start)
            is_answer = positions == pos[:, None]  # [batch, k]
            if wrong is None:
                w = None
            elif config.lens_target == "answer":
                w = wrong[:, None].expand_as(positions)
            else:
                w = torch.where(is_answer, wrong[:, None], torch.full_like(positions, -1))
            read = lens_mod.lens_readout(model, acts, positions, targets, w, output)
            lens_err = max(lens_err, read.output_error)
            real_pos = positions - start[:, None]  # [batch, k]: 0 = the row's first real token
            keep = torch.arange(positions.shape[1])[None, :] <= (pos - start)[:, None]  # [batch, k]: drop repeats
            n_layer = read.logprob.shape[0]
            layer_idx = torch.arange(n_layer)[:, None, None].expand_as(read.logprob)
            sel = keep[None].expand_as(read.logprob)
            lens_frames.append(pd.DataFrame({
                "example": examples[None, :, None].expand_as(read.logprob)[sel].numpy(),
                "layer": layer_idx[sel].numpy(),
                "stage": [labels[i] for i in layer_idx[sel].tolist()],
                "position": real_pos[None].expand_as(read.logprob)[sel].numpy(),
                "target": targets[None].expand_as(read.logprob)[sel].numpy(),
                "is_answer": is_answer[None].expand_as(read.logprob)[sel].numpy(),
                "logprob": read.logprob[sel].numpy(),
                "rank": read.rank[sel].numpy(),
                "top1_within_rounding": read.near_top[sel].numpy(),  # review 20a B1: top-1 not decided by rounding
                "logit_diff": read.logit_diff[sel].numpy(),
            }))
        if dla:
            directions = dla_mod.unembed_directions(model, answers, wrong)
            stack = dla_mod.dla_stack(model, acts, pos, directions, answers, wrong, output)
            n_comp = len(stack.labels)
            frame = pd.DataFrame({
                "example": examples.repeat(n_comp).numpy(),
                "component": [c for c in stack.labels for _ in examples],
                "kind": [k for k in stack.kinds for _ in examples],
                "layer": [x for x in stack.layers for _ in examples],
                "head": [x for x in stack.heads for _ in examples],
                "contribution": stack.contributions.reshape(-1).numpy(),
            })
            logit = pd.DataFrame({"example": examples.numpy(), "final_logit": stack.logit.numpy(),
                                  "logit_before_softcap": stack.logit_before_cap.numpy(),
                                  "logit_size": stack.logit_size.numpy()})
            dla_frames.append((frame, logit))
            if experts:
                expert_frames.append(experts_mod.expert_rows(model, acts, pos, slots, directions, examples))
    lens_df = pd.concat(lens_frames, ignore_index=True) if lens_frames else None
    dla_df = logits = None
    if dla_frames:
        dla_df = pd.concat([f for f, _ in dla_frames], ignore_index=True)
        for col in ("layer", "head"):
            dla_df[col] = dla_df[col].astype("Int64").mask(dla_df[col] < 0)
        logits = pd.concat([g for _, g in dla_frames], ignore_index=True)
    direction = "answer - wrong_answer" if wrong_all is not None else "answer"
    experts_df = pd.concat(expert_frames, ignore_index=True) if expert_frames else None
    return lens_df, dla_df, logits, lens_err, direction, experts_df


# ---- summaries -----------------------------------------------------------------------------
def lens_summary(lens: pd.DataFrame, output_error: float) -> dict:
    at = lens[lens.is_answer]
    g = at.groupby("layer")
    per_layer = pd.DataFrame({
        "mean_rank": g["rank"].mean(), "median_rank": g["rank"].median(), "mean_logprob": g.logprob.mean(),
        "top1_fraction": g["rank"].apply(lambda r: float((r == 0).mean())), "mean_logit_diff": g.logit_diff.mean(),
    })
    top1 = per_layer.index[per_layer.median_rank == 0]
    answers = at.drop_duplicates("example").target  # [example]: one answer each
    counts = answers.value_counts()
    return {
        "lens_mean_rank_per_layer": {str(l): float(v) for l, v in per_layer.mean_rank.items()},
        "lens_mean_logprob_per_layer": {str(l): float(v) for l, v in per_layer.mean_logprob.items()},
        "lens_top1_fraction_per_layer": {str(l): float(v) for l, v in per_layer.top1_fraction.items()},
        "lens_top1_count_per_layer": {str(l): int(v) for l, v in g["rank"].apply(lambda r: int((r == 0).sum())).items()},
        # review 20a B1: of those, the examples whose answer is top-1 with another token within one rounding step
        **({"lens_top1_within_rounding_per_layer": {str(l): int(v) for l, v in g.top1_within_rounding.sum().items()}}
           if "top1_within_rounding" in at else {}),
        "lens_mean_logit_diff_per_layer": {str(l): (None if pd.isna(v) else float(v))
                                           for l, v in per_layer.mean_logit_diff.items()},
        # its 95% t interval over the examples with a wrong answer (None under two), as the lens figure draws it
        "lens_logit_diff_ci_per_layer": {str(l): chance.mean_interval(d.to_numpy(dtype=float))
                                         for l, d in g.logit_diff},
        "lens_logit_diff_n": int(at.drop_duplicates("example").logit_diff.notna().sum()),
        "first_top1_layer": int(top1[0]) if len(top1) else None,
        # the rate a constant guess of the commonest answer is top-1: the baseline a layer's top-1 count must beat
        "lens_constant_guess": float(counts.iloc[0] / len(answers)) if len(answers) else None,
        "lens_n_answers": int(len(counts)),  # distinct answers among the lens examples
        "lens_final_output_error": output_error,
    }


def dla_mean(dla: pd.DataFrame) -> pd.DataFrame:
    """One row per component: mean and standard deviation of its contribution over examples."""
    g = dla.groupby("component", sort=False)
    first = g[["kind", "layer", "head"]].first()
    stats = g.contribution.agg(contribution="mean", std="std")
    return first.join(stats).reset_index()


NAMED = 3  # the writers a finding names: the paired differences among them are recorded
ZERO = 1e-5  # float32's floor: a non-head component whose |contribution| stays below this fraction of the largest is 0


def zero_floor(dla: pd.DataFrame, dtype: torch.dtype = torch.float32) -> float:
    """The size under which a component's contribution is 0 up to rounding: max(ZERO, eps(dtype)/2) of the table's
    largest |contribution| (half a rounding step of the largest writer; float32 keeps ZERO, its decomposition's
    own arithmetic). Review 16av-B1: in bfloat16 hook_attn_out minus the heads left 2e-4 to 4e-4 logits (a model
    without attention biases), over 1e-5 of the largest, so attn_bias and remainder were tied writers."""
    return max(ZERO, float(torch.finfo(dtype).eps) / 2) * float(dla.contribution.abs().max() or 0.0)


def zero_components(dla: pd.DataFrame, dtype: torch.dtype = torch.float32) -> list[str]:
    """The components other than heads that are 0 up to rounding on every example (|contribution| <= zero_floor in
    `dtype`, the run's): the attention and unembedding biases of a model without biases, the remainder. They
    are not writers, so they are not ranked or tied (review 13b C3: "tied with ... 4 attn_bias, 1 remainder,
    1 unembed_bias" on Gemma 2); the components figure leaves them out (summary dla_zero_components)."""
    floor = zero_floor(dla, dtype)
    rows = dla[dla.kind != "head"]
    silent = rows.groupby("component", sort=False).contribution.apply(lambda c: bool((c.abs() <= floor).all()))
    return [str(c) for c, v in silent.items() if v]


def writer_intervals(dla: pd.DataFrame, components: list[str]) -> tuple[dict, list[dict]]:
    """Per-example uncertainty of the listed writers (ranked by |mean|, largest first).

    Returns ({component: {"mean", "sd", "ci" (95% t interval over examples, None for one), "n"}},
    [{"a", "b", "difference", "ci", "n", "tied"}] for each pair among the first NAMED): difference is
    the mean over examples of |a| - |b| in the direction of each mean (sign(mean_a) a - sign(mean_b) b,
    paired by example), and tied says its 95% interval contains 0 (None with one example): two writers
    whose means differ by less than their per-example spread are not ranked."""
    wide = dla[dla.component.isin(components)].pivot(index="example", columns="component",
                                                     values="contribution")  # [example, component]
    stats = {}
    for c in components:
        x = wide[c].dropna().to_numpy(dtype=float)
        stats[c] = {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if len(x) > 1 else None,
                    "ci": chance.mean_interval(x), "n": int(len(x))}
    pairs = []
    named = components[:NAMED]
    for i, a in enumerate(named):
        for b in named[i + 1:]:
            sa, sb = (1.0 if stats[a]["mean"] >= 0 else -1.0), (1.0 if stats[b]["mean"] >= 0 else -1.0)
            diff = (sa * wide[a] - sb * wide[b]).dropna().to_numpy(dtype=float)  # [example]
            ci = chance.mean_interval(diff)
            pairs.append({"a": a, "b": b, "difference": float(diff.mean()), "ci": ci, "n": int(len(diff)),
                          "tied": None if ci is None else bool(ci[0] <= 0.0 <= ci[1])})
    return stats, pairs


def _total(dla: pd.DataFrame, kind: str) -> dict | None:
    """All writers of one kind summed per example: {"mean", "sd", "ci" (95% t interval over examples), "n",
    "count" (writers summed)}; None when the model has none."""
    rows = dla[dla.kind == kind]
    if not len(rows):
        return None
    x = rows.groupby("example").contribution.sum().to_numpy(dtype=float)  # [example]
    return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if len(x) > 1 else None,
            "ci": chance.mean_interval(x), "n": int(len(x)), "count": int(rows.component.nunique())}


NOT_WRITERS = ("remainder", "ln_final_bias", "unembed_bias")  # DLA rows that no block writes: never tied with a writer


def within_interval(ranked: pd.DataFrame, intervals: dict, named: list[str]) -> dict | None:
    """The writers beyond the named ones whose mean lies inside the last named writer's 95% interval:
    {"component": the last named, "within": [their names, largest |mean| first], "kinds", "means": theirs,
    "reaches_zero": the interval holds 0} (None without an interval). A ranking that stops at the last named writer
    would hide them. The remainder (rounding) and the final norm's and unembedding's biases are not writers, so never
    listed; where the interval reaches 0 the finding says that instead of a list of every near-zero writer (review
    17a B3: "tied with 23 components (..., 1 ln_final_bias, 1 remainder)")."""
    if not named or (intervals.get(named[-1]) or {}).get("ci") is None:
        return None
    lo, hi = intervals[named[-1]]["ci"]
    rest = ranked[~ranked.component.isin(named) & ranked.contribution.between(lo, hi) & ~ranked.kind.isin(NOT_WRITERS)]
    return {"component": named[-1], "within": list(rest.component), "kinds": list(rest.kind),
            "means": [float(v) for v in rest.contribution], "reaches_zero": bool(lo <= 0.0 <= hi)}


RECONSTRUCTION_STEPS = 4  # float32 rounding steps (of reconstruction_size) the decomposition's own arithmetic may miss by


def reconstruction_size(dla: pd.DataFrame, logits: pd.DataFrame) -> pd.Series:
    """[example]: the size the decomposition's own float32 rounding scales with, |logit(answer)| + |logit(wrong)|
    (logits' logit_size: the model's logits are rounded at their own size, not at their difference's) plus
    sqrt(rows) x sum |rows| (each row is rounded at its own size; n rows summed add sqrt(n) such errors).
    Review 15av A1: sized on sum |rows| alone (about 1 logit) it called float32 rounding of logits of 4.8 an
    error."""
    rows = dla.contribution.abs().groupby(dla.example)
    spread = rows.sum() * np.sqrt(rows.count().astype(float))
    return spread + _logit_size(logits, spread.index)


def _logit_size(logits: pd.DataFrame, index: pd.Index) -> pd.Series:
    own = logits.set_index("example").get("logit_size")
    return (pd.Series(0.0, index=index) if own is None else own.reindex(index)).fillna(0.0)


def reconstruction_tolerance(dla: pd.DataFrame, logits: pd.DataFrame, dtype: torch.dtype) -> pd.Series:
    """[example]: how far the rows' sum may miss the model's logit (difference) by rounding. The model rounds in
    `dtype`: its two logits once each at their own size (half a step each, eps/2 x logit_size) after the unembedding's
    own rounding (as much again), and the residual stream once per add, never larger along the logit direction than
    the rows' summed sizes (one step, eps x sum |rows|): eps(dtype) x (logit_size + sum |rows|), plus the
    decomposition's own float32 arithmetic, RECONSTRUCTION_STEPS float32 steps of reconstruction_size (the whole
    budget in float32). Review 16c B4: 4 steps of sqrt(rows) x sum |rows| let bfloat16 pass 6.9 logits on a logit
    difference of 10; this allows 0.45 there, while the reviewers' bfloat16 BLOOM, DeepSeek-V3 and two Granites miss
    by at most 0.24-0.39 of it."""
    rows = dla.contribution.abs().groupby(dla.example).sum()  # [example]
    model = float(torch.finfo(dtype).eps) * (rows + _logit_size(logits, rows.index))
    own = RECONSTRUCTION_STEPS * float(torch.finfo(torch.float32).eps) * reconstruction_size(dla, logits).clip(lower=1.0)
    return (own + model).reindex(rows.index)


def dla_summary(dla: pd.DataFrame, logits: pd.DataFrame, direction: str, top_k: int,
                softcap: float | None = None, dtype: torch.dtype = torch.float32) -> dict:
    """softcap: the model's final logit soft-cap (lens.final_softcap): the rows then sum to the logit
    (difference) before it (logits' logit_before_softcap column), not to the capped output.

    The rows' sum against the model's own logit (difference) is checked: beyond
    dla_reconstruction_tolerance, each example's reconstruction_tolerance in `dtype` (the largest over examples is
    recorded), a HeadscopeWarning says so and
    dla_reconstruction_ok is False (a scaling of the stream or logits the decomposition misses: review 15a A1,
    Granite's logits_scaling)."""
    mean = dla_mean(dla)
    writers = dla[~dla.kind.isin(["ln_final_bias", "unembed_bias"])].groupby("example").contribution.sum()
    biases = dla[dla.kind.isin(["ln_final_bias", "unembed_bias"])].groupby("example").contribution.sum()
    biases = biases.reindex(writers.index, fill_value=0.0)
    by_example = logits.set_index("example")
    final = by_example.final_logit.reindex(writers.index)
    before = by_example.logit_before_softcap.reindex(writers.index) if softcap is not None else final
    errors = (writers + biases - before).abs()  # [example]
    steps = reconstruction_tolerance(dla, logits, dtype).reindex(writers.index)  # [example]
    error = errors.max()
    tolerance = float(steps.max()) if len(steps) else RECONSTRUCTION_STEPS * noise_floor(dtype, 1.0)
    missed = errors > steps
    reconstruction_ok = not bool(missed.any())
    if not reconstruction_ok:
        worst = (errors - steps)[missed].idxmax()
        warnings.warn(HeadscopeWarning(
            f"direct logit attribution: the rows miss the model's own logit (difference) by up to {float(error):.3g}, "
            f"beyond the {float(steps[worst]):.3g} that {str(dtype).removeprefix('torch.')} rounding allows (of the "
            f"logits' and rows' size) on {int(missed.sum())} of "
            f"{len(errors)} examples; "
            f"some scaling of the residual stream or the logits is not in the decomposition, so its numbers are "
            f"not the model's."), stacklevel=2)
    ranked = mean.reindex(mean.contribution.abs().sort_values(ascending=False).index)
    zero = zero_components(dla, dtype)
    ranked = ranked[~ranked.component.isin(zero)]  # not writers: never ranked or tied
    heads = ranked[ranked.kind == "head"]
    intervals, differences = writer_intervals(dla, list(ranked.component.head(top_k)))
    return {
        "dla_direction": direction,
        "dla_top_components": {r.component: float(r.contribution) for r in ranked.head(top_k).itertuples()},
        "dla_top_intervals": intervals,
        "dla_top_differences": differences,
        "dla_top_heads": {r.component: float(r.contribution) for r in heads.head(top_k).itertuples()},
        "dla_last_named_ties": within_interval(ranked, intervals, list(ranked.component.head(min(NAMED, top_k)))),
        "dla_zero_components": zero,  # 0 up to `dtype` rounding on every example: not ranked, not drawn
        "dla_total_heads": _total(dla, "head"),
        "dla_total_mlps": _total(dla, "mlp"),
        "dla_sum_components": float(writers.mean()),
        "dla_bias_terms": float(biases.mean()),
        "dla_final_logit": float(final.mean()),  # the model's output (after its soft-cap, where it has one)
        "dla_final_softcap": softcap,  # None: no final soft-cap, the rows sum to dla_final_logit
        "dla_logit_before_softcap": float(before.mean()) if softcap is not None else None,  # what the rows sum to
        "dla_max_reconstruction_error": None if pd.isna(error) else float(error),
        "dla_reconstruction_tolerance": float(tolerance),  # checked: beyond it a warning, and ok False
        "dla_reconstruction_ok": reconstruction_ok,
        "norm_convention": NORM_CONVENTION,
    }


# ---- entry points --------------------------------------------------------------------------
@takes_prompt
@names_source
def logit_lens(model, task=None, config: CircuitsConfig | None = None, **config_overrides: Any) -> Result:
    """The logit lens on `task` (see the module doc). df = table "lens". config_overrides are
    fields of CircuitsConfig (lens_target="answer")."""
    config = configure(CircuitsConfig, config, config_overrides, name="logit_lens")
    _refuse_encoder(model)
    task = default_task(model, task, config)
    lens, _, _, err, _, _ = _collect(model, task, config, lens=True, dla=False)
    summary = {**lens_summary(lens, err), "task": task.name, "n_examples": len(task)}
    return Result(name="circuits", df=lens, summary=summary, tables={"lens": lens}, config=asdict(config))


@takes_prompt
@names_source
def direct_logit_attribution(model, task=None, config: CircuitsConfig | None = None,
                             **config_overrides: Any) -> Result:
    """Direct logit attribution on `task` (see the module doc). df = table "dla_mean". config_overrides
    are fields of CircuitsConfig (top_k=5)."""
    config = configure(CircuitsConfig, config, config_overrides, name="direct_logit_attribution")
    _refuse_encoder(model)
    task = default_task(model, task, config)
    _, dla, logits, _, direction, experts = _collect(model, task, config, lens=False, dla=True)
    mean = dla_mean(dla)
    summary = {**dla_summary(dla, logits, direction, config.top_k, lens_mod.final_softcap(model), model.dtype),
               "dla_post_norms": dla_mod.post_norms(model), "task": task.name, "n_examples": len(task),
               "dla_attn_bias_parts": dla_mod.attn_bias_parts(model),  # what each head's row leaves to attn_bias
               # the mlpN components that are whole mixture-of-experts blocks (the finding says which)
               "n_layers": model.facts.n_layers,
               "moe_layers": hooks.moe_layers(model)}
    tables = {"dla": dla, "dla_mean": mean, **_expert_tables(experts, dla, summary)}
    return Result(name="circuits", df=mean, summary=summary, tables=tables, config=asdict(config))


def _expert_tables(experts: pd.DataFrame | None, dla: pd.DataFrame, summary: dict) -> dict[str, pd.DataFrame]:
    """Mixture-of-experts models: tables "dla_experts" (per example, layer and expert) and "dla_experts_mean" (per
    layer and expert: mean, interval, n, n_routed), and summary dla_top_expert (experts.top_expert: the top MoE
    layer's leading expert against the next); {} and nothing added on a dense model."""
    if experts is None or not len(experts):
        return {}
    summary["dla_top_expert"] = experts_mod.top_expert(experts, dla)
    return {"dla_experts": experts, "dla_experts_mean": experts_mod.expert_means(experts)}


def run(model, task=None, config: CircuitsConfig | None = None) -> Result:
    """`headscope circuits`: the logit lens and DLA on one task from shared passes. df = "dla_mean";
    tables "lens", "dla", "dla_mean"; encoders give summary {"skipped": reason}."""
    config = config or CircuitsConfig.preset()
    if model.facts.is_encoder:
        reason = f"{model.facts.name} is an encoder: the logit lens and DLA read next-token logits."
        return Result(name="circuits", df=pd.DataFrame(), summary={"skipped": reason}, config=asdict(config))
    refuse_readout(model, READOUT)
    task = default_task(model, task, config)
    lens, dla, logits, err, direction, experts = _collect(model, task, config, lens=True, dla=True)
    mean = dla_mean(dla)
    summary = {**lens_summary(lens, err),
               **dla_summary(dla, logits, direction, config.top_k, lens_mod.final_softcap(model), model.dtype),
               "dla_post_norms": dla_mod.post_norms(model), "task": task.name, "n_examples": len(task),
               "dla_attn_bias_parts": dla_mod.attn_bias_parts(model),  # what each head's row leaves to attn_bias
               # the mlpN components that are whole mixture-of-experts blocks (the finding says which)
               "n_layers": model.facts.n_layers,
               "moe_layers": hooks.moe_layers(model)}
    tables = {"lens": lens, "dla": dla, "dla_mean": mean, **_expert_tables(experts, dla, summary)}
    if config.edges and task.corrupted_tokens is not None and getattr(model.facts, "mla", None):
        summary["edges_skipped"] = MLA_EDGES
    elif config.edges and task.corrupted_tokens is not None:  # edge attribution and faithfulness
        from headscope.analyses.circuits.faithfulness import circuit_discovery

        try:
            pairs, left_out = task.pairs("edge attribution")  # a user's pair of two token lengths is left out
            if left_out:
                summary.update(pairs_left_out=left_out, pairs_left_out_rows=task.unpaired_rows)
            found, edge_summary = circuit_discovery(model, pairs, ig_steps=config.ig_steps, method=config.edge_method,
                                                    k_values=config.k_values,
                                                    seed=config.seed)
        except (UnsupportedModelError, TaskError, ConfigError) as err:  # Gemma 2's post-norms; no pair of one
            # length; no clean-corrupted gap to normalise by (corrupted prompts that change nothing)
            summary["edges_skipped"] = str(err)
        except NotImplementedError as err:  # a hook TransformerLens refuses for this model: the lens and DLA
            # above still stand (review 15b A1), the reason in one line
            first = (str(err).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")
            summary["edges_skipped"] = (f"TransformerLens cannot give this model's edge hooks ({first}); the logit "
                                        "lens and DLA above are unaffected.")
        except Exception as err:  # noqa: BLE001 - any other failure of the edges (reviews 16a/16c A1): the lens and
            # DLA above stand; the traceback goes to the log, the failure in one line to the finding
            logging.getLogger(__name__).exception("circuits: edge attribution failed; the lens and DLA are kept")
            first = (str(err).strip().splitlines() or [""])[0]
            summary["edges_skipped"] = (f"edge attribution failed ({type(err).__name__}: {first}); the logit lens and "
                                        "DLA above are unaffected.")
        else:
            tables.update(found)
            summary.update(edge_summary, edges_n_examples=len(pairs))  # the pairs; the lens and DLA use n_examples
    return Result(name="circuits", df=mean, summary=summary, tables=tables, config=asdict(config))
