"""MLP layers as key-value memories: the `mlp` analysis (Geva et al. 2021, 2022).

An MLP computes FF(x) = sum_i m_i v_i + b with memory coefficients m_i = f(x . k_i) (gated MLPs:
act(x . g_i) * (x . k_i)) read at mlp.hook_post. Three readings:

- trigger examples of key i: the corpus prefixes with the top-k m_i at their last position,
  streamed chunk by chunk with a bounded-memory top-k (memory does not grow with the corpus);
- values in vocabulary space: the top tokens of E v_i, E the unembedding W_U [d_model, d_vocab].
  E carries the model's logit scale (Granite's 1 / logits_scaling), so E v_i is in the model's logits.
  v_i is the neuron's write into the residual stream: times the block's residual-write scale (Granite's
  residual_multiplier); on post-norm blocks (Gemma 2/3, OLMo 2: a
  norm of the whole MLP output before the residual add) the column of the output weight times
  that norm's per-entry gain, read from the module (Gemma's 1 + weight), since the gain is part
  of the write and can reorder a neuron's tokens. By default the final norm is NOT applied (as
  Geva et al. 2021 project E v_i directly); `apply_final_norm=True` multiplies v_i by the final
  norm's gain (and centres it under LayerNorm) first. The residual-dependent scale of either norm
  is positive and shared by a token's neurons, so it is left out: it never changes a neuron's
  ranking of tokens, nor the order of a token's sub-updates;
- sub-updates m_i v_i at a Task's answer position (Geva et al. 2022), the largest by norm, and
  the tokens each promotes (the top tokens of m_i E v_i).

Key-value agreement of a layer: the fraction of its keys whose value's top token equals the
next token of the key's top trigger example (Geva et al. 2021, sec. 4), with `agreement_any`
(next token of any of the top-k triggers) and a shuffled baseline (values paired with the
triggers of random other keys of the layer).

Padded Tasks and corpora (decoders left-padded) run with their attention_mask: prefixes end at real
tokens only and count positions among the row's real tokens, and sub-updates are read at each
row's own answer position, so every example gives what it gives alone.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import pandas as pd
import torch
from tqdm.auto import tqdm

import headscope.hooks as hooks
from headscope.analyses.core import chance
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import Needs, one_token_answers
from headscope.analyses.core.metrics import spacing
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task
from headscope.analyses.mlp.topk_stream import StreamingTopK
from headscope.errors import ConfigError, UnsupportedModelError
from headscope.execution import batching, block_shape
from headscope.models import config_facts
from headscope.models.readout import unembed_weight

# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=True, decoder=True, what="reads MLP values through the unembedding as next tokens",
              model_gap=hooks.memories_gap)


@dataclass(frozen=True, kw_only=True)
class MLPConfig(AnalysisConfig):
    top_k_triggers: int = 25  # trigger examples kept per key (Geva et al.: 25)
    top_k_tokens: int = 5  # tokens shown per value / sub-update
    n_top_updates: int = 5  # largest sub-updates kept per example and layer
    n_top_neurons: int = 20  # rows of the top-neuron table
    chunk_size: int = 32  # corpus rows per forward pass
    min_position: int = 1  # first prefix end considered (1 skips the lone <bos> prefix)
    apply_final_norm: bool = False
    layers: tuple[int, ...] | None = None  # the layers analysed (None: every layer)

    QUICK: ClassVar[dict[str, Any]] = {"top_k_triggers": 10}


@dataclass(frozen=True, kw_only=True)
class TriggerExamples:
    """Per layer and key, the top-k prefixes; a prefix is (corpus row, last position). One tensor per
    layer (index i is layers[i]), since layers may differ in memories (a dense MLP among mixtures of
    experts: Qwen2-MoE's mlp_only_layers, DeepSeek's first_k_dense_replace)."""

    layers: tuple[int, ...]
    coefficients: Sequence[torch.Tensor]  # per layer [d_mlp, k] m_i at the prefix's last position, decreasing
    row: Sequence[torch.Tensor]  # per layer [d_mlp, k] corpus row (rows of the corpus batches, concatenated)
    position: Sequence[torch.Tensor]  # per layer [d_mlp, k] last position of the prefix, among the row's real tokens
    next_token: Sequence[torch.Tensor]  # per layer [d_mlp, k] the token after the prefix
    n_prefixes: int


Corpus = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # tokens [rows, pos], or (tokens, attention_mask)


def _corpus_batches(corpus: Corpus | Iterable[Corpus]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each batch as (tokens [rows, pos], attention_mask [rows, pos]; all ones when none was given)."""
    for batch in [corpus] if isinstance(corpus, (torch.Tensor, tuple)) else corpus:
        tokens, mask = batch if isinstance(batch, tuple) else (batch, None)
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            raise ConfigError(f"corpus batches must be [rows, pos] token tensors with pos >= 2, got shape "
                             f"{tuple(tokens.shape)}; each row is a prompt followed by its next tokens.")
        if mask is not None and mask.shape != tokens.shape:
            raise ConfigError(f"a corpus batch's attention_mask has shape {tuple(mask.shape)}, its tokens "
                             f"{tuple(tokens.shape)}; give one mask entry per token.")
        yield tokens, torch.ones_like(tokens) if mask is None else mask


def real_rows(corpus: Sequence[Corpus]) -> list[torch.Tensor]:
    """Every corpus row's real tokens [n], padding dropped, rows numbered across batches in order."""
    return [row[keep.bool()] for tokens, mask in _corpus_batches(corpus) for row, keep in zip(tokens, mask)]


def _prefixes(mask: torch.Tensor, min_position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which (row, p) of a [rows, pos] batch end a scored prefix, and its position among the row's real
    tokens: p and p + 1 real (the prefix has a next token) and at least min_position real tokens
    before p. Returns (valid [rows, pos - 1] bool, own position [rows, pos - 1])."""
    real = mask.bool()  # [rows, pos]
    own = real.long().cumsum(1) - 1  # [rows, pos] index among the row's real tokens
    valid = real[:, :-1] & real[:, 1:] & (own[:, :-1] >= min_position)  # [rows, pos - 1]
    return valid, own[:, :-1]


@torch.no_grad()
def trigger_examples(
    model, corpus: Corpus | Iterable[Corpus], *, k: int = 25, layers: Sequence[int] | None = None,
    chunk_size: int = 32, min_position: int = 1, progress: bool = False,
) -> TriggerExamples:
    """Top-k prefixes by m_i for every key of `layers` over a corpus, in bounded memory.

    corpus: [rows, pos] tokens, a (tokens, attention_mask) pair for padded rows (left or right
    padding), or an iterable of such batches (lengths may differ between batches; a generator is
    consumed once and never held). Rows are numbered across batches in order. Prefixes end at
    positions min_position .. n-2 of each row's n real tokens, so every prefix has a next token;
    padded rows run with their attention_mask, padding ends no prefix, and positions count real
    tokens only, so a padded row gives the prefixes and coefficients of the row run alone.
    """
    layers = tuple(range(model.facts.n_layers) if layers is None else (model.check_layer(layer) for layer in layers))
    sites = [hooks.site("mlp_post", layer) for layer in layers]
    topk = [StreamingTopK(k, hooks.n_memories(model, layer)) for layer in layers]
    row_offset = 0
    chunks = ((t, m, start) for t, m in _corpus_batches(corpus) for start in range(0, t.shape[0], chunk_size))
    for batch, batch_mask, start in tqdm(chunks, desc="mlp triggers", disable=not progress):
        tokens = batch[start:start + chunk_size].cpu()  # [chunk, pos]
        mask = batch_mask[start:start + chunk_size].cpu()  # [chunk, pos]
        valid, own = _prefixes(mask, min_position)  # [chunk, pos - 1] each
        positions = torch.arange(min(min_position, tokens.shape[1] - 1), tokens.shape[1] - 1)  # padded coordinates
        valid, own = valid[:, positions], own[:, positions]  # [chunk, n_pos]: a prefix ends at or after min_position
        rows = row_offset + torch.arange(tokens.shape[0])  # [chunk]
        row_offset += tokens.shape[0]
        if not valid.any():
            continue
        padded = not bool(mask.bool().all())
        acts = hooks.capture(model, tokens[:, :-1], sites, positions=positions,
                             attention_mask=mask[:, :-1] if padded else None)
        ids = torch.stack(torch.broadcast_tensors(rows[:, None], own, tokens[:, positions + 1]), dim=-1)[valid]
        for name, running in zip(sites, topk):
            m = acts[name][valid.to(acts[name].device)]  # [n_valid, d_mlp], (row, position) major
            running.update(m.T, ids)  # scores [d_mlp, n_valid], ids [n_valid, (row, position, next token)]
    if topk[0].ids is None:
        raise ConfigError("the corpus has no prefix (rows need more than min_position + 1 real tokens); "
                          "pass at least one [rows, pos] batch of tokens.")
    return TriggerExamples(  # t.ids [d_mlp, k, (row, position, next token)] per layer
        layers=layers, coefficients=tuple(t.values for t in topk), row=tuple(t.ids[..., 0] for t in topk),
        position=tuple(t.ids[..., 1] for t in topk), next_token=tuple(t.ids[..., 2] for t in topk),
        n_prefixes=topk[0].n_seen,
    )


def post_norm_gain(model, layer: int) -> torch.Tensor | None:
    """[d_model] float32: the per-entry gain of the norm block `layer` applies to its whole MLP output
    (Gemma 2/3's and OLMo 2's post_feedforward_layernorm), read from the module (block_shape.norm_gain:
    Gemma's 1 + weight, OLMo 2's weight); None where the MLP writes into the residual as it is."""
    norm = block_shape.post_mlp_norm(model.bridge.blocks[layer])
    return None if norm is None else block_shape.norm_gain(norm)[0]


def written_values(model, layer: int, *, apply_final_norm: bool = False, neurons: torch.Tensor | None = None) -> torch.Tensor:
    """The value vectors as they reach the unembedding, [n_neurons, d_model] (all neurons by default):
    v_i times the block's residual-write scale (Granite's residual_multiplier, facts.residual_scale)
    and the post-MLP norm's gain on post-norm blocks (the norm's shared scale left out: positive
    and the same for every neuron of a token; on post-LN OPT blocks the block's ln2, which normalises
    the whole stream after the add, centred and times its gain, the same scale left out), then with
    apply_final_norm the final norm's gain (centred
    first under LayerNorm). See the module doc."""
    values = hooks.mlp_memories(model, layer).values  # [d_mlp, d_model]
    if neurons is not None:
        values = values[neurons]
    residual = float(getattr(model.bridge.blocks[layer], "residual_contribution_scale", 1.0))
    if residual != 1.0:  # Granite's residual_multiplier: the block writes residual x its MLP's output
        values = values * residual
    gain = post_norm_gain(model, layer)
    if gain is not None:
        values = values * gain.to(values)
    if getattr(model.facts, "post_ln", False):  # OPT post-LN: the block's ln2 normalises the stream the MLP adds to
        gain, centres = block_shape.norm_gain(block_shape.raw(model.bridge.blocks[layer].ln2))
        values = (values - values.mean(-1, keepdim=True) if centres else values) * gain.to(values)
    ln = getattr(model.bridge, "ln_final", None)
    if apply_final_norm and ln is not None:
        gain, centres = block_shape.norm_gain(block_shape.raw(ln))
        if centres:
            values = values - values.mean(-1, keepdim=True)
        values = values * gain.to(values)
    return values


def value_logits(model, layer: int, *, apply_final_norm: bool = False, neurons: torch.Tensor | None = None) -> torch.Tensor:
    """E v_i for the given neurons (all by default): [n_neurons, d_vocab], v_i as written (written_values),
    E the unembedding (P^T W_U where project_out P maps the stream first, OPT-350m) times the model's logit
    scale (facts.logit_scale: Granite's 1 / logits_scaling)."""
    w_u = unembed_weight(model).detach()  # [d_model, d_vocab]: P^T W_U through OPT-350m's project_out (review 16d A5)
    written = written_values(model, layer, apply_final_norm=apply_final_norm, neurons=neurons)  # [n_neurons, d_model]
    out = written @ w_u.to(written.device)
    scale = model.facts.logit_scale
    return out if scale == 1.0 else out * scale


def value_top_tokens(model, layer: int, *, top_k: int = 5, apply_final_norm: bool = False, block: int = 1024) -> torch.Tensor:
    """Top tokens of E v_i for every neuron of a layer: [d_mlp, top_k], computed in neuron blocks."""
    out, n = [], hooks.n_memories(model, layer)
    for start in range(0, n, block):
        neurons = torch.arange(start, min(start + block, n))
        out.append(value_logits(model, layer, apply_final_norm=apply_final_norm, neurons=neurons).topk(top_k, -1).indices.cpu())
    return torch.cat(out)  # [d_mlp, top_k]


@torch.no_grad()
def sub_updates_at(model, tokens: torch.Tensor, layer: int, position: int = -1, *,
                   attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficients m [batch, d_mlp] and sub-updates m_i v_i [batch, d_mlp, d_model] at one position.

    Their sum over neurons plus the output bias is the MLP output there (GPT-OSS: plus its experts' output biases
    times the router's weights, hooks.MLPMemories.routed_bias). attention_mask [batch, pos]
    for padded tokens (left padding: position -1 is every row's last real token).
    """
    name = hooks.site("mlp_post", model.check_layer(layer))
    m = hooks.capture(model, tokens, [name], positions=[position], attention_mask=attention_mask)[name][:, 0]  # [batch, d_mlp]
    return m, hooks.mlp_memories(model, layer).sub_updates(m)


def agreement(triggers: TriggerExamples, value_top: torch.Tensor, seed: int = 0) -> pd.DataFrame:
    """Per layer: agreement (top trigger), agreement_any (any of the k) and their shuffled baselines
    (agreement_shuffled, agreement_any_shuffled: each value against the triggers of another key of
    the layer, one permutation per layer for both).

    value_top: per layer [d_mlp] the top token of each value, layers as in `triggers`.
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, layer in enumerate(triggers.layers):
        nxt = triggers.next_token[i]  # [d_mlp, k]
        top = value_top[i]  # [d_mlp]
        shuffled = nxt[torch.randperm(nxt.shape[0], generator=g)]  # [d_mlp, k]: another key's triggers
        rows.append({
            "layer": layer,
            "agreement": (top == nxt[:, 0]).float().mean().item(),
            "agreement_any": (top[:, None] == nxt).any(1).float().mean().item(),
            "agreement_shuffled": (top == shuffled[:, 0]).float().mean().item(),
            "agreement_any_shuffled": (top[:, None] == shuffled).any(1).float().mean().item(),
        })
    return pd.DataFrame(rows)


def _mask_if_padded(task: Task) -> torch.Tensor | None:
    return task.attention_mask if task.padded else None


def _answer_activations(model, task: Task, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """{site: [batch, d] float32 on the CPU}: each row's activation at its answer position, from
    passes of as many rows as memory holds (execution.batching.rows_per_pass)."""
    last = task.answer_positions()  # [batch]
    mask = _mask_if_padded(task)
    step = batching.rows_per_pass(model, task.tokens.shape[1])
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for start in range(0, len(task), step):
        sl = slice(start, start + step)
        read, slot = last[sl].unique(return_inverse=True)  # [n_read] positions to capture, [rows] each row's among them
        with torch.no_grad():
            acts = hooks.capture(model, task.tokens[sl], names, positions=read.tolist(),
                                 attention_mask=None if mask is None else mask[sl])
        for name in names:
            parts[name].append(acts[name].float().cpu()[torch.arange(len(slot)), slot])  # [rows, d]
    return {name: torch.cat(parts[name]) for name in names}


def task_sub_updates(model, task: Task, *, layers: Sequence[int], n_top: int = 5, top_k_tokens: int = 5,
                     apply_final_norm: bool = False,
                     acts: Mapping[str, torch.Tensor] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The largest sub-updates at each Task prompt's answer position and the tokens they promote.

    Padded Tasks run with their attention_mask and each row is read at its own last real position
    (Task.answer_positions), so every example's sub-updates are those of the example run alone.

    Returns (top, per_neuron): `top` has one row per (example, layer, rank) with the neuron, m_i,
    ||m_i v_i|| (v_i as written: written_values), its direct logit on the answer m_i (E v_i)[answer], the
    promoted tokens and whether the answer (and, when the Task has wrong answers, the wrong answer) is among them;
    `per_neuron` has every (layer, neuron) with the mean ||m_i v_i|| and mean m_i over examples (0 where a
    mixture of experts did not route the example to the neuron's expert: `n_routed` says on how many it did).
    acts: the layers' "mlp_post" at each row's answer position (_answer_activations) where the caller captured them
    already (with the router logits routing_margins reads, in one pass); None: captured here.
    """
    one_token_answers(task, "mlp")
    answers = None if task.answers is None else task.answers.cpu()
    wrong = None if task.wrong_answers is None or answers is None else task.wrong_answers.cpu()
    top_rows, neuron_rows = [], []
    names = [hooks.site("mlp_post", layer) for layer in layers]
    if acts is None:
        acts = _answer_activations(model, task, names)
    for layer, name in zip(layers, names):
        m = acts[name]  # [batch, d_mlp] at each row's answer position
        memories = hooks.mlp_memories(model, layer)
        v_norm = written_values(model, layer).norm(dim=-1).float().cpu()  # [d_mlp] (v_i as written)
        norms = m.abs() * v_norm  # [batch, d_mlp] = ||m_i v_i||
        order = norms.topk(min(n_top, norms.shape[1]), -1).indices  # [batch, n_top]
        logits = value_logits(model, layer, apply_final_norm=apply_final_norm, neurons=order.reshape(-1)).float().cpu()
        logits = logits.reshape(*order.shape, -1) * m.gather(1, order)[..., None]  # [batch, n_top, d_vocab]
        promoted = logits.topk(top_k_tokens, -1).indices  # [batch, n_top, top_k]
        for b in range(m.shape[0]):
            for rank in range(order.shape[1]):
                neuron = int(order[b, rank])
                toks = promoted[b, rank]
                top_rows.append({
                    "example": b, "layer": layer, "rank": rank, "neuron": neuron,
                    **({} if memories.expert is None else {"expert": int(memories.expert[neuron]),
                                                           "expert_neuron": int(memories.neuron[neuron])}),
                    "coefficient": m[b, neuron].item(), "update_norm": norms[b, neuron].item(),
                    "answer_logit": logits[b, rank, int(answers[b])].item() if answers is not None else float("nan"),
                    "promotes_answer": bool(answers is not None and (toks == answers[b]).any()),
                    # the wrong answer among the same top tokens: a verb-promoting neuron promotes both
                    **({} if wrong is None else {"promotes_wrong": bool((toks == wrong[b]).any())}),
                    "promoted": " ".join(model.to_str_tokens(toks)),
                })
        per = pd.DataFrame({
            "layer": layer, "neuron": range(m.shape[1]),
            "task_update_norm": norms.mean(0).numpy(), "task_coefficient": m.mean(0).numpy(),
        })
        if memories.expert is not None:  # mixture of experts: neuron i is (expert, expert_neuron)
            per.insert(2, "expert", memories.expert.numpy())
            per.insert(3, "expert_neuron", memories.neuron.numpy())
            # examples whose answer position was routed to the neuron's expert (a routed expert's coefficients
            # are 0 exactly where the router did not choose it; the shared expert's never): its means mix
            # how strongly a neuron writes with how often its expert is chosen
            experts = memories.expert.long()  # [d_mlp]
            routed = torch.zeros(m.shape[0], int(experts.max()) + 1, dtype=torch.bool)  # [batch, expert]
            for e in experts.unique().tolist():
                routed[:, e] = (m[:, experts == e] != 0).any(1)
            per.insert(4, "n_routed", routed.sum(0)[experts].numpy())
            # the mean over the examples routed to the neuron's expert only (NaN where none was): how strongly it
            # writes when chosen (review 16b B1: the mean over all examples tends to rank a dense layer first)
            mean_on, sd_on = routed_mean_sd(norms, routed[:, experts])  # [d_mlp] each
            per["task_update_norm_routed"] = mean_on.numpy()
            per["task_update_norm_routed_sd"] = sd_on.numpy()
        neuron_rows.append(per)
    return _whole(pd.DataFrame(top_rows)), _whole(pd.concat(neuron_rows, ignore_index=True))


def routed_mean_sd(norms: torch.Tensor, on: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """norms [batch, d_mlp], on [batch, d_mlp] bool (the neuron's expert chosen on the example) -> (mean [d_mlp],
    sample sd (ddof 1) [d_mlp]) over the examples `on` marks: NaN mean where none, NaN sd under two."""
    w = on.to(norms.dtype)
    n = w.sum(0)  # [d_mlp]
    mean = (norms * w).sum(0) / n  # 0/0: NaN
    var = (((norms - mean) ** 2) * w).sum(0) / (n - 1)
    return mean, torch.where(n >= 2, var.clamp_min(0).sqrt(), torch.full_like(var, float("nan")))


def _whole(table: pd.DataFrame) -> pd.DataFrame:
    """The expert columns as nullable integers: a dense layer's rows among mixtures of experts have none (<NA>),
    which would otherwise turn every expert id into a float."""
    columns = [c for c in ("expert", "expert_neuron", "n_routed") if c in table]
    return table.astype({c: "Int64" for c in columns}) if columns else table


def _margin_layers(model, layers: Sequence[int]) -> list[int]:
    """The MoE layers whose router margins routing_margins measures: top-k of more experts than k, in half
    precision (bfloat16, float16); [] otherwise."""
    if model.dtype not in (torch.bfloat16, torch.float16):
        return []
    return [l for l in layers if (e := hooks.expert_layout(model, l)) is not None and e.top_k and e.top_k < e.n_experts]


def router_sites(model, layers: Sequence[int]) -> list[str]:
    """The "router_logits" sites routing_margins reads ([] in float32 or without MoE layers), for a caller that
    captures them in its own pass at the answer positions."""
    return [hooks.site("router_logits", layer) for layer in _margin_layers(model, layers)]


def routing_margins(model, task: Task, layers: Sequence[int],
                    acts: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """In half precision (bfloat16, float16), how close each MoE layer's top-k router choice at each example's answer
    position is to rounding: the margin between the k-th and the (k+1)-th of the scores the router ranks for its
    choice (models.moe_layout.choice_scores: the logits, or a sigmoid or softmax of them plus a correction bias), in
    steps of the dtype the router computes them in at the larger of the two (eps * 2^floor(log2 |x|)). Returns
    {"routing_dtype" (the model's), "routing_within_rounding" {layer: examples whose margin is at most one step},
    "routing_margin_steps_min" {layer: the least finite margin, in steps; None where no example has a next expert it
    could choose}, "routing_near_ties" {layer: [{"example", "chosen": the k-th expert, "next": the (k+1)-th}] of those
    examples}, "routing_score" {layer: what the scores are and their dtype}}; empty in float32 or without MoE layers
    (a per-expert claim rests on these choices: review 11c C2). acts: `router_sites` at each row's answer position
    where the caller captured them (_answer_activations); None: captured here."""
    from headscope.models.moe_layout import choice_scores

    dtype = model.dtype
    moe = _margin_layers(model, layers)
    if not moe:
        return {}
    names = router_sites(model, layers)
    if acts is None:
        acts = _answer_activations(model, task, names)  # {site: [batch, experts]}: dtype values, exact in float32
    within, least, ties, what = {}, {}, {}, {}
    for layer, name in zip(moe, names):
        k = hooks.expert_layout(model, layer).top_k
        scores, words, computed = choice_scores(model, layer, acts[name])  # [batch, experts] what the router ranks
        ranked, order = scores.sort(-1, descending=True)  # [batch, experts] scores and the experts they belong to
        last, nxt = ranked[:, k - 1], ranked[:, k]  # [batch] the last chosen score and the next one (-inf: none)
        step = spacing(computed, torch.maximum(last.abs(), nxt.abs()))  # [batch] one step there
        margin = torch.where(torch.isfinite(nxt), (last - nxt) / step, torch.full_like(step, float("inf")))  # [batch]
        within[str(layer)] = int((margin <= 1).sum())
        finite = margin[torch.isfinite(margin)]
        least[str(layer)] = float(finite.min()) if finite.numel() else None
        # review 18c B1: which experts each such choice could swap, so a routed count can say how far it may move
        ties[str(layer)] = [{"example": i, "chosen": int(order[i, k - 1]), "next": int(order[i, k])}
                            for i in (margin <= 1).nonzero().reshape(-1).tolist()]
        what[str(layer)] = f"{words} ({str(computed).removeprefix('torch.')})"
    return {"routing_dtype": str(dtype).removeprefix("torch."), "routing_within_rounding": within,
            "routing_margin_steps_min": least, "routing_near_ties": ties, "routing_score": what}


@torch.no_grad()
def negative_triggers(model, corpus: Sequence[Corpus], trig: TriggerExamples) -> dict[str, int]:
    """Per layer, how many neurons' top trigger has a negative pre-activation k_i . x (site mlp_pre at the trigger's
    last position, each row run alone on its real tokens, as trigger_examples counts positions): on an activation that
    is positive below 0 (config_facts.positive_below_zero: Apertus's xIELU) such a trigger is a prefix the key points
    away from (review 20b B1). {layer: count}; the count is over the layer's memories."""
    rows = real_rows(corpus)
    sites = {layer: hooks.site("mlp_pre", layer) for layer in trig.layers}
    need = sorted({int(r) for rs in trig.row for r in rs[:, 0].tolist()})  # rows holding some neuron's top trigger
    pre: dict[int, dict[str, torch.Tensor]] = {}
    for r in need:
        acts = hooks.capture(model, rows[r][None], list(sites.values()))  # {site: [1, pos, d_mlp]}
        pre[r] = {name: a[0].float().cpu() for name, a in acts.items()}
    out = {}
    for i, layer in enumerate(trig.layers):
        row, pos = trig.row[i][:, 0], trig.position[i][:, 0]  # [d_mlp] each neuron's top trigger
        neurons = torch.arange(row.shape[0])
        values = torch.stack([pre[int(r)][sites[layer]][int(p), int(n)] for r, p, n in zip(row, pos, neurons)])
        out[str(layer)] = int((values < 0).sum())
    return out


def _against_wrong(updates: pd.DataFrame) -> dict[str, int | None]:
    """Counts of updates promoting the answer only, the wrong answer only, and both (None without wrong answers)."""
    if "promotes_wrong" not in updates:
        return {"n_task_updates_answer_only": None, "n_task_updates_wrong_only": None, "n_task_updates_both": None}
    right, wrong = updates.promotes_answer.astype(bool), updates.promotes_wrong.astype(bool)
    return {"n_task_updates_answer_only": int((right & ~wrong).sum()),
            "n_task_updates_wrong_only": int((wrong & ~right).sum()), "n_task_updates_both": int((right & wrong).sum())}


def _prefix_text(model, tokens: torch.Tensor, position: int, width: int = 8) -> str:
    """The last `width` tokens of a prefix, the trigger token in brackets (raw; escape when rendering)."""
    start = max(0, position - width + 1)
    words = model.to_str_tokens(tokens[start:position + 1])
    words[-1] = f"[{words[-1]}]"
    return ("… " if start > 0 else "") + " ".join(words)


def zoo_corpus(model, n_examples: int, seed: int = 0) -> list[torch.Tensor]:
    """A corpus from the four zoo tasks: each prompt followed by its answer, [n, pos + 1] per task."""
    from headscope.analyses.core import tasks

    batches = []
    for i, name in enumerate(tasks.ZOO_TASKS):
        t = tasks.zoo(model, name, n_examples=n_examples, seed=seed + 1000 * (i + 1))
        batches.append(torch.cat([t.tokens, t.answers[:, None]], dim=1))  # [n, pos + 1]
    return batches


@takes_prompt
@names_source
def mlp_memories_analysis(model, task: Task | str | None = None, config: MLPConfig | None = None, *,
                          corpus: Corpus | Sequence[Corpus] | None = None, **config_overrides: Any) -> Result:
    """Trigger examples, value tokens, agreement per layer and the Task's largest sub-updates.

    task: a Task, zoo task name or task file (None: zoo "facts", or sentences; default_inputs); corpus: the prompts scanned for
    trigger examples, [rows, pos] tokens or (tokens, attention_mask) pairs (None: the zoo corpus, or
    the Task's prompts and answers for other models, task_corpus; data, not a setting); config_overrides
    are fields of MLPConfig (layers=(0,), top_k_triggers=10). Padded Tasks and corpora run with
    their masks; padding is never a prefix nor an answer position.

    df (results.csv): one row per (layer, neuron) (a mixture of experts: per expert neuron, with `expert`,
    `expert_neuron` and `n_routed`, the task examples whose answer position went to that expert). Counts,
    intervals and tests are over each layer's memories (hooks.n_memories: every expert's neurons).
    tables: "agreement" (per layer), "top_neurons" (by mean ||m_i v_i|| on the Task, with trigger prompts
    and promoted tokens; raw strings, escape when rendering), "task_updates" (largest sub-updates per example and layer).
    """
    config = configure(MLPConfig, config, config_overrides, name="mlp_memories_analysis")
    if gap := hooks.memories_gap(model):  # review 19b A1: a layout the memories cannot read, before any work
        raise UnsupportedModelError(gap)
    if model.facts.is_encoder:
        raise ConfigError(f"the mlp analysis reads values through the unembedding and next tokens; "
                         f"{model.facts.name} is an encoder without a trained LM head. Use a decoder.")
    if not isinstance(task, Task) or corpus is None:
        default_task, default_corpus = default_inputs(model, task, config)
        task, corpus = default_task, default_corpus if corpus is None else corpus
    corpus = [corpus] if isinstance(corpus, (torch.Tensor, tuple)) else list(corpus)
    layers = tuple(range(model.facts.n_layers)) if config.layers is None else tuple(map(model.check_layer, config.layers))
    # each layer's own memories: a dense MLP among mixtures of experts has fewer (Qwen2-MoE's mlp_only_layers),
    # so every per-layer tensor below is one per layer, never stacked
    sizes = {layer: hooks.n_memories(model, layer) for layer in layers}
    experts = {str(layer): layout.as_dict() for layer in layers if (layout := hooks.expert_layout(model, layer)) is not None}
    at = {layer: i for i, layer in enumerate(layers)}  # layer -> its index in the per-layer tensors
    trig = trigger_examples(model, corpus, k=config.top_k_triggers, layers=layers, chunk_size=config.chunk_size,
                            min_position=config.min_position, progress=config.progress)
    value_top = [value_top_tokens(model, layer, top_k=config.top_k_tokens, apply_final_norm=config.apply_final_norm)
                 for layer in layers]  # per layer [d_mlp, top_k]
    agree = agreement(trig, [v[:, 0] for v in value_top])
    signed = (negative_triggers(model, corpus, trig)
              if not model.facts.gated_mlp and not experts and config_facts.positive_below_zero(model.bridge) else None)
    # one pass at the answer positions for the sub-updates and (half precision, MoE) the router logits
    answer_acts = _answer_activations(model, task, [hooks.site("mlp_post", layer) for layer in layers]
                                      + router_sites(model, layers))
    top_updates, per_neuron = task_sub_updates(model, task, layers=layers, n_top=config.n_top_updates,
                                               top_k_tokens=config.top_k_tokens, apply_final_norm=config.apply_final_norm,
                                               acts=answer_acts)
    strs = lambda ids: model.to_str_tokens(ids)  # noqa: E731
    cat = lambda parts: torch.cat(list(parts))  # noqa: E731  per-layer [d_mlp] -> [sum of d_mlp], layers in order
    df = per_neuron.assign(
        top_coefficient=cat(c[:, 0] for c in trig.coefficients).numpy(),
        trigger_next=strs(cat(n[:, 0] for n in trig.next_token)),
        value_top=strs(cat(v[:, 0] for v in value_top)),
        agrees=cat(v[:, 0] == n[:, 0] for v, n in zip(value_top, trig.next_token)).numpy(),
        agrees_any=cat((v[:, :1] == n).any(-1) for v, n in zip(value_top, trig.next_token)).numpy(),
    )
    rows = real_rows(corpus)  # trigger positions count real tokens only
    best = df.nlargest(config.n_top_neurons, "task_update_norm")
    table = best.assign(
        value_tokens=[" ".join(strs(value_top[at[layer]][n])) for layer, n in zip(best.layer, best.neuron)],
        triggers=[" | ".join(_prefix_text(model, rows[int(trig.row[at[layer]][n, j])], int(trig.position[at[layer]][n, j]))
                             for j in range(min(3, trig.row[0].shape[-1]))) for layer, n in zip(best.layer, best.neuron)],
    )
    summary = {
        "agreement_per_layer": {str(r.layer): r.agreement for r in agree.itertuples()},
        "agreement_any_per_layer": {str(r.layer): r.agreement_any for r in agree.itertuples()},
        "agreement_shuffled_per_layer": {str(r.layer): r.agreement_shuffled for r in agree.itertuples()},
        "n_prefixes": trig.n_prefixes,
        # what each agreement fraction is over: the layer's memories (d_mlp; every expert's neurons on a
        # mixture of experts), per layer, and their common number (None where layers differ: dense and MoE)
        "n_memories_per_layer": {str(layer): n for layer, n in sizes.items()},
        "n_neurons_per_layer": sizes[layers[0]] if len(set(sizes.values())) == 1 else None,
        # the counts behind each share (agreement = count / n_memories_per_layer): the findings' Wilson intervals
        "agreement_count_per_layer": _counts(agree, "agreement", sizes),
        "agreement_any_count_per_layer": _counts(agree, "agreement_any", sizes),
        "agreement_shuffled_count_per_layer": _counts(agree, "agreement_shuffled", sizes),
        "agreement_any_shuffled_per_layer": {str(r.layer): r.agreement_any_shuffled for r in agree.itertuples()},
        "agreement_any_shuffled_count_per_layer": _counts(agree, "agreement_any_shuffled", sizes),
        # Fisher's exact tests on those counts: each layer against its control, the best layer against the others
        "agreement_tests": agreement_tests(_counts(agree, "agreement", sizes), _counts(agree, "agreement_shuffled", sizes),
                                           {str(layer): n for layer, n in sizes.items()}),
        "task": task.name,
        "answer_promoted_fraction": float(top_updates.promotes_answer.mean()) if len(top_updates) else float("nan"),
        # answer_promoted_fraction = n_task_updates_promoting / n_task_updates: the top n_top_updates sub-updates
        # of each of n_task_examples examples in each analysed layer
        "n_task_updates": len(top_updates),
        "n_task_updates_promoting": int(top_updates.promotes_answer.sum()) if len(top_updates) else 0,
        # with wrong answers: how many updates hold the answer and not the wrong answer among their top
        # top_k_tokens, the reverse, and both (a baseline: a neuron promoting "a verb" promotes both); else None
        **_against_wrong(top_updates),
        "top_k_tokens": config.top_k_tokens,
        "n_task_examples": len(task),
        "n_top_updates": config.n_top_updates,
        "n_layers_analysed": len(layers),
        "apply_final_norm": config.apply_final_norm,
        # post-norm blocks (Gemma 2/3, OLMo 2): value vectors taken through the post-MLP norm's gain
        "values_through_post_norm": any(block_shape.post_mlp_norm(model.bridge.blocks[layer]) is not None
                                        for layer in layers),
        # post-LN blocks (OPT, do_layer_norm_before=False): through their own block's LayerNorm (review 16d A5)
        "values_through_post_ln": bool(getattr(model.facts, "post_ln", False)),
        "gated_mlp": model.facts.gated_mlp,
        # review 20b B1: an activation positive below 0 (xIELU): neurons whose top trigger has k_i . x < 0, per layer
        **({"negative_top_triggers_per_layer": signed} if signed is not None else {}),
        # the activation's config name (relu2: squared coefficients); the experts' own where they ignore it (GPT-OSS)
        "mlp_act": getattr(model.facts, "expert_act", None) or getattr(model.facts, "mlp_act", None),
        # the three neurons with the largest mean update at the answer, with their expert and its routing (the finding
        # names them with n_routed in words: a mean over examples counts the zeros of those not routed to the expert)
        "top_neurons": [_named(row, experts) for row in table.head(3).itertuples()],
        # the routed experts' neurons with the largest mean update over the examples routed to their expert, with that
        # n (review 16b B1: the ranking above counts their unrouted examples' zeros); [] without routed experts
        "top_expert_neurons_routed": _routed_top(df, experts),
        "routed_min": MIN_ROUTED,  # experts routed on fewer task examples are not ranked by their routed mean
        "experts_routed_too_few": _too_few(df, experts),
        "mixture_of_experts": bool(experts),
        **routing_margins(model, task, layers, acts=answer_acts),
        # mixture-of-experts layers: {layer: {n_experts, expert_width, top_k, shared_width}} (their memories)
        "experts_per_layer": experts,
    }
    return Result(name="mlp", df=df, summary=summary,
                  tables={"agreement": agree, "top_neurons": table.reset_index(drop=True), "task_updates": top_updates},
                  config={**asdict(config), "task": task.name})


MIN_ROUTED = 5  # routed task examples an expert needs before its neurons' routed means are ranked (review 17v B1)


def _routed(df: pd.DataFrame, experts: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of routed (not shared) experts' neurons with a routed mean."""
    shared = [(int(l), e["n_experts"]) for l, e in experts.items() if e.get("shared_width")]
    rows = df[df.expert.notna() & df.task_update_norm_routed.notna()]
    return rows[[(int(l), int(e)) not in shared for l, e in zip(rows.layer, rows.expert)]]


def _routed_top(df: pd.DataFrame, experts: Mapping[str, Any], n: int = 3) -> list[dict[str, Any]]:
    """The `n` routed (not shared) expert neurons with the largest task_update_norm_routed among experts routed on
    at least MIN_ROUTED task examples, each with its layer, expert, neuron within it, that mean, its 95% t interval
    over the routed examples (ci), clipped at 0 (a norm is never negative; ci_clipped: review 18v B4, [-0.21, 1.13]),
    and n_routed; [] for a dense model. Review 17v B1: the three largest were one
    expert's, routed on 2 of 16 examples, ranked against means over 13 and 16 with no interval."""
    if "task_update_norm_routed" not in df:  # a dense model
        return []
    rows = _routed(df, experts)
    rows = rows[rows.n_routed >= MIN_ROUTED]
    out = []
    for r in rows.nlargest(n, "task_update_norm_routed").itertuples():
        sd = getattr(r, "task_update_norm_routed_sd", float("nan"))
        half = float(chance.t_half_width(float(sd), int(r.n_routed)))
        mean = float(r.task_update_norm_routed)
        out.append({"layer": int(r.layer), "neuron": int(r.neuron), "expert": int(r.expert),
                    "expert_neuron": int(r.expert_neuron), "task_update_norm_routed": mean,
                    "ci": None if half != half else [max(0.0, mean - half), mean + half],
                    "ci_clipped": half == half and mean - half < 0.0, "n_routed": int(r.n_routed)})
    return out


def _too_few(df: pd.DataFrame, experts: Mapping[str, Any]) -> list[dict[str, int]]:
    """The routed experts chosen on some task examples but fewer than MIN_ROUTED: {layer, expert, n_routed}, layer
    then expert order (their neurons' routed means are not ranked)."""
    if "task_update_norm_routed" not in df:  # a dense model
        return []
    rows = _routed(df, experts)
    few = rows[(rows.n_routed > 0) & (rows.n_routed < MIN_ROUTED)].drop_duplicates(["layer", "expert"])
    return [{"layer": int(r.layer), "expert": int(r.expert), "n_routed": int(r.n_routed)}
            for r in few.sort_values(["layer", "expert"]).itertuples()]


def _named(row, experts: Mapping[str, Any]) -> dict[str, Any]:
    """A top neuron for the summary: layer, neuron, mean ||m_i v_i||, and on a mixture-of-experts layer its expert,
    the neuron within it, whether it is the shared expert and on how many task examples it was routed."""
    out = {"layer": int(row.layer), "neuron": int(row.neuron), "task_update_norm": float(row.task_update_norm)}
    layout = experts.get(str(int(row.layer)))
    if layout is not None and not pd.isna(getattr(row, "expert", None)):
        out |= {"expert": int(row.expert), "expert_neuron": int(row.expert_neuron), "n_routed": int(row.n_routed),
                "shared": bool(layout["shared_width"]) and int(row.expert) == layout["n_experts"]}
    return out


def agreement_tests(counts: dict[str, int], control: dict[str, int], n: int | Mapping[str, int]) -> dict[str, Any]:
    """Two-sided Fisher's exact tests on agreeing-neuron counts (k of n per layer; n: one number for every
    layer or {layer: its memories}): "control_p_per_layer" {layer: p of k against that layer's shuffled
    control}, "best_layer" (most agreeing; the first of equals), "best_vs_layer_p" {other layer: p of best
    against it} and "best_vs_others_p" (best against the other layers pooled; None with one layer). The best
    layer is picked after looking, so its p values against the others are optimistic: the finding reports
    them as such. With layers of different sizes the best is the highest share, not the highest count.
    control_verdicts adds each layer's control p Bonferroni-corrected over the layers and the layers above it."""
    size = (lambda l: int(n[l])) if isinstance(n, Mapping) else (lambda l: int(n))  # noqa: E731
    out: dict[str, Any] = {"control_p_per_layer": {l: chance.fisher_p(k, size(l), control[l], size(l))
                                                   for l, k in counts.items() if l in control}}
    out |= control_verdicts(out["control_p_per_layer"], counts, control)
    if not counts:
        return {**out, "best_layer": None, "best_vs_layer_p": {}, "best_vs_others_p": None}
    best = max(counts, key=lambda l: counts[l] / size(l))
    others = [l for l in counts if l != best]
    out["best_layer"] = best
    out["best_vs_layer_p"] = {l: chance.fisher_p(counts[best], size(best), counts[l], size(l)) for l in others}
    out["best_vs_others_p"] = (chance.fisher_p(counts[best], size(best), sum(counts[l] for l in others),
                                               sum(size(l) for l in others)) if others else None)
    return out


def control_verdicts(p_per_layer: Mapping[str, float], counts: Mapping[str, int], control: Mapping[str, int],
                     alpha: float | None = None) -> dict[str, Any]:
    """Which layers agree more than their own shuffled control, each of the L per-layer Fisher tests
    Bonferroni-corrected (p x L, at most 1): the finding's verdict on "these MLPs" reads every layer, so one
    of four layers at p = 0.034 uncorrected (0.14 corrected) is no detection (review 13b A3).
    "control_p_bonferroni_per_layer" {layer: corrected p}, "above_control_layers" (corrected p < alpha and
    more agreeing neurons than the control), "above_control_uncorrected_only" (p < alpha only before it); alpha
    defaults to chance.ALPHA, read at the call (the level the mlp finding prints: reports/plots_mlp.py)."""
    alpha = chance.ALPHA if alpha is None else alpha
    n_tests = len(p_per_layer)
    corrected = {l: min(1.0, float(p) * n_tests) for l, p in p_per_layer.items()}
    more = [l for l in p_per_layer if counts.get(l, 0) > control.get(l, 0)]
    return {"control_p_bonferroni_per_layer": corrected,
            "above_control_layers": [l for l in more if corrected[l] < alpha],
            "above_control_uncorrected_only": [l for l in more if p_per_layer[l] < alpha <= corrected[l]]}


def _counts(agree: pd.DataFrame, column: str, sizes: Mapping[int, int]) -> dict[str, int]:
    """{layer: memories} behind a per-layer fraction of that layer's sizes[layer] memories (exact: each
    fraction is a count / n)."""
    return {str(r.layer): int(round(getattr(r, column) * sizes[int(r.layer)])) for r in agree.itertuples()}


def default_inputs(model, task: Task | str | None, config: MLPConfig) -> tuple[Task, list[torch.Tensor]]:
    """The Task (default zoo "facts": recall from the weights; other models: the shipped sentences cut
    to one length, default_tasks.text_task) and the trigger corpus (the zoo's four tasks;
    other models: the Task's prompts and answers)."""
    from headscope.analyses.core import default_tasks
    from headscope.analyses.core.task_files import resolve_task

    n = config.examples(128, 16)
    if task is None:
        task = default_tasks.zoo_or(model, "facts", lambda: default_tasks.text_task(model, n, config.seed),
                                    n, config.seed)
    task = resolve_task(model, task, default="facts", n_examples=n, seed=config.seed)
    try:
        corpus = zoo_corpus(model, n_examples=n, seed=config.seed)
    except ValueError:  # not a zoo vocabulary
        corpus = [task_corpus(task)]
    return task, corpus


def task_corpus(task: Task) -> Corpus:
    """The Task's prompts each followed by its answer: [batch, pos + 1] tokens, with the attention
    mask (the answer is real) when the Task is padded. Right-padded prompts get the answer right
    after their last real token."""
    last = task.answer_positions()  # [batch]
    tokens = torch.cat([task.tokens, task.tokens.new_zeros(len(task), 1)], dim=1)  # [batch, pos + 1]
    tokens[torch.arange(len(task)), last + 1] = task.answers.to(tokens.dtype)
    if not task.padded:
        return tokens
    mask = torch.cat([task.attention_mask.cpu(), task.attention_mask.new_zeros(len(task), 1).cpu()], dim=1)
    mask[torch.arange(len(task)), last + 1] = 1
    return tokens, mask  # the new column is padding (id 0, masked) where the answer went inside the row


def run(model, task: Task | str | None = None, config: MLPConfig | None = None) -> Result:
    """`headscope mlp`: mlp_memories_analysis on the default inputs (default_inputs)."""
    config = config or MLPConfig.preset()
    return mlp_memories_analysis(model, task, config)
