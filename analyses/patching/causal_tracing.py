"""Causal tracing (Meng et al. 2022, ROME): which hidden states carry a subject's fact.

Corrupt run: the token embeddings of the subject span get seeded Gaussian noise of std
noise_scale x the std of the subject embeddings (3 in the paper); each of n_samples noise draws
is shared by all runs of that sample. Restored run: the same noise, plus one clean activation put
back: the hidden state (resid_post) of one layer at one position, or the MLP / attention output
at one position over a window of layers centred on the layer. Indirect effect
IE = metric_restored - metric_corrupt (the metric is the answer's probability by default),
averaged over noise samples and prompts (AIE). Rows with pos = NA restore all positions at
once (restoring every position of a hidden state gives back the clean run exactly). Every run
goes through the batching engine.

Padded tasks (left-padded, spans in padded positions): runs go under the task's attention
mask, a cell whose position is padding in a row is NaN there and left out of its AIE and of the
role table (role "padding" is never averaged), and each prompt's noise may be given (`noise=`),
so a padded run can be compared with each prompt run alone under the same noise.

Expected shape on factual recall: MLP peaks at the last subject token in middle layers; a late
peak at the last token.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope.analyses.core.chance import mean_interval
from headscope.analyses.core.config import configure
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task
from headscope.analyses.patching.configs import TracingConfig
from headscope.analyses.patching.engine import index_mask, padding_mask, replace_hook, run_batched
from headscope.analyses.patching.inputs import mask_padding, resolve_metric, token_labels
from headscope.errors import ConfigError, ShapeMismatchError, TaskError
from headscope.hooks.capture import capture
from headscope.hooks.sites import site

KINDS = {"resid": "resid_post", "mlp": "mlp_out", "attn": "attn_out"}  # what is restored -> site kind
ROLES = ("prefix", "first subject", "middle subject", "last subject", "first subsequent", "further", "last token")


def default_window(n_layers: int) -> int:
    """Meng et al. restore 10 of GPT-2 XL's 48 layers; the same share, at least 1."""
    return max(1, round(n_layers * 10 / 48))


def window_layers(kind: str, layer: int, window: int, n_layers: int) -> range:
    """Layers restored for a run centred on `layer` (hidden states: that layer only)."""
    if kind == "resid":
        return range(layer, layer + 1)
    start = max(0, layer - window // 2)
    return range(start, min(n_layers, layer - window // 2 + window))


def roles(span: torch.Tensor, n_pos: int, mask: torch.Tensor | None = None) -> np.ndarray:
    """[batch, 2] half-open subject spans -> [batch, pos] role names (Meng et al.'s token groups);
    "padding" where mask [batch, pos] is 0."""
    out = np.empty((span.shape[0], n_pos), dtype=object)
    real = None if mask is None else mask.bool().cpu().numpy()
    for b, (start, end) in enumerate(span.tolist()):
        for p in range(n_pos):
            if real is not None and not real[b, p]:
                out[b, p] = "padding"
            elif p == n_pos - 1:
                out[b, p] = "last token"
            elif p < start:
                out[b, p] = "prefix"
            elif p == end - 1:
                out[b, p] = "last subject"
            elif p == start:
                out[b, p] = "first subject"
            elif p < end:
                out[b, p] = "middle subject"
            else:
                out[b, p] = "first subsequent" if p == end else "further"
    return out


def subject_noise(model, tokens: torch.Tensor, span: torch.Tensor, n_samples: int, scale: float,
                  seed: int, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """Seeded noise [sample, batch, pos, d_model], zero outside the span; and the subject
    embeddings' std (spans hold real tokens only, so padding never enters it)."""
    n_prompts, n_pos = tokens.shape
    in_span = _in_span(span, n_pos)  # [batch, pos]
    embed = capture(model, tokens, [site("embed")], attention_mask=attention_mask)[site("embed")].cpu()  # [batch, pos, d_model]
    std = float(embed[in_span].std())
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n_samples, n_prompts, n_pos, embed.shape[-1], generator=gen)  # [sample, batch, pos, d_model]
    noise = noise * (scale * std) * in_span[None, :, :, None]
    return noise.to(model.device, embed.dtype), std


def _in_span(span: torch.Tensor, n_pos: int) -> torch.Tensor:
    """[batch, 2] half-open spans -> [batch, pos] bool."""
    positions = torch.arange(n_pos)
    return (positions >= span[:, :1]) & (positions < span[:, 1:])


BOUNDS = {"prob": (0.0, 1.0), "logprob": (-np.inf, 0.0)}  # what a metric's mean can be: its intervals stop there


@takes_prompt
@names_source
def causal_tracing(
    model,
    task=None,
    config: TracingConfig | None = None,
    *,
    noise: torch.Tensor | None = None,
    **config_overrides: Any,
) -> Result:
    """Causal tracing of `task` (needs task.spans[config.span]) with per-(kind, layer, position) AIEs.

    config: a TracingConfig; config_overrides are its fields (kinds, span, n_samples, noise_scale,
    window, metric, seed, batch_size, memory_budget, progress). task: a Task, zoo task name or task
    file (None: the zoo "facts" task). noise (data): [n_samples, batch, pos, d_model] added to the
    embeddings instead of the seeded draw (subject_noise), e.g. one prompt's share of a batch's
    noise (noise_scale and seed then unused).
    Returns a Result: df (and tables["causal_tracing"]) with kind, layer, pos, token and role (each
    named only where every prompt that has the position agrees, else ""), ie (AIE) and restored (the mean metric after restoring);
    tables["causal_tracing_roles"] averages IEs per (kind, layer, role) over prompts; summary
    has clean/corrupted metric (the corrupted one each prompt's mean over the noise samples) with their 95% t
    intervals over prompts and the paired one of the drop (drop_ci), the noise std and the peak cell of each kind.
    """
    cfg = configure(TracingConfig, config, config_overrides, name="causal_tracing")
    kinds, span, n_samples = cfg.kinds, cfg.span, cfg.n_samples
    if not isinstance(task, Task):
        from headscope.analyses.core.task_files import resolve_task

        task = resolve_task(model, task, default="facts", n_examples=cfg.examples(32, 8), seed=cfg.seed)
    tokens, mask, spans = _checked_inputs(model, task, cfg)
    pm = resolve_metric(task, cfg.metric)
    n_layers, n_pos = model.facts.n_layers, tokens.shape[1]
    window = default_window(n_layers) if cfg.window is None else int(cfg.window)
    noise, noise_std = _noise(model, cfg, tokens, spans, mask, noise)
    clean = capture(model, tokens, [site(KINDS[k], layer) for k in kinds for layer in range(n_layers)],
                    attention_mask=mask)
    cells = [(k, layer, p) for k in kinds for layer in range(n_layers) for p in [*range(n_pos), None]]
    runs = [(s, cell) for s in range(n_samples) for cell in [None, *cells]]  # None: corrupted baseline
    values = run_batched(model, tokens, len(runs), _tracing_hooks(runs, noise, clean, window, n_layers), pm.fn,
                         batch_size=cfg.batch_size, memory_budget=cfg.memory_budget, progress=cfg.progress,
                         stacked_metric=pm.stacked, desc="causal tracing", attention_mask=mask)
    values = values.view(n_samples, len(cells) + 1, -1)  # [sample, 1 + cell, batch]
    corrupt = values[:, 0]  # [sample, batch]
    ie = mask_padding((values[:, 1:] - corrupt[:, None]).mean(0), [c[2] for c in cells], mask)  # [cell, batch], NaN: padding
    restored = mask_padding(values[:, 1:].mean(0), [c[2] for c in cells], mask).nanmean(1)  # [cell]
    labels = token_labels(model, tokens, mask)
    role_of = roles(spans, n_pos, mask)  # [batch, pos]
    shared = [set(role_of[:, p]) - {"padding"} for p in range(n_pos)]
    role_at = [next(iter(r)) if len(r) == 1 else "" for r in shared]  # "": the prompts' roles differ there
    df = pd.DataFrame({
        "kind": [c[0] for c in cells],
        "layer": [c[1] for c in cells],
        "pos": pd.array([c[2] for c in cells], dtype="Int64"),
        "token": [labels[c[2]] if c[2] is not None else "all" for c in cells],
        "role": [role_at[c[2]] if c[2] is not None else "all" for c in cells],
        "ie": ie.double().nanmean(1).numpy(),
        "restored": restored.double().numpy(),
    })
    by_role = role_table(cells, ie, role_of)
    clean_rows = pm.fn(clean.output).double().cpu()  # [batch]
    noised_rows = corrupt.double().mean(0).cpu()  # [batch]: each prompt's metric noised, over the noise samples
    summary = {
        "metric": pm.name,
        "span": span,
        "clean_metric": float(clean_rows.mean()),
        "corrupted_metric": float(noised_rows.mean()),
        # review 20: the finding's drop had no interval: 95% t intervals over prompts, the drop's paired
        "clean_metric_ci": mean_interval(clean_rows.numpy(), bounds=BOUNDS.get(pm.name)),
        "corrupted_metric_ci": mean_interval(noised_rows.numpy(), bounds=BOUNDS.get(pm.name)),
        "drop_ci": mean_interval((clean_rows - noised_rows).numpy()),
        "noise_std": noise_std,
        "n_samples": n_samples,
        "window": window,
        "n_examples": int(tokens.shape[0]),
        "peaks": peaks(df, by_role),
    }
    config_out = {"kinds": list(kinds), "span": span, "n_samples": n_samples, "noise_scale": cfg.noise_scale,
                  "window": window, "seed": cfg.seed}
    return Result(name="patching", df=df, summary=summary,
                  tables={"causal_tracing": df, "causal_tracing_roles": by_role}, config=config_out)


def _checked_inputs(model, task: Task, cfg: TracingConfig) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(tokens [batch, pos], padding mask or None, the span [batch, 2] on CPU), after one clear error
    for unknown kinds, a missing span, no samples or a span over padding."""
    unknown = [k for k in cfg.kinds if k not in KINDS]
    if unknown or not cfg.kinds:
        raise ConfigError(f"Unknown causal-tracing kinds {unknown}; choose from {tuple(KINDS)}.")
    if cfg.span not in task.spans:
        raise ConfigError(f"Task {task.name!r} marks no {cfg.span!r} span (it has {sorted(task.spans)}); "
                          "causal tracing noises the subject tokens, so pass span= or add the span.")
    if cfg.n_samples < 1:
        raise ConfigError(f"n_samples must be >= 1, got {cfg.n_samples}.")
    tokens = model.check_tokens(task.tokens)
    mask = padding_mask(task.attention_mask, tokens)  # [batch, pos] or None
    spans = task.spans[cfg.span].cpu()
    if mask is not None and bool((_in_span(spans, tokens.shape[1]) & ~mask.bool().cpu()).any()):
        raise TaskError(f"Task {task.name!r}: a {cfg.span!r} span covers padding; spans of a padded task are in "
                        "padded positions (hs.load_task shifts them), so shift it past the row's padding.")
    return tokens, mask, spans


def _noise(model, cfg: TracingConfig, tokens: torch.Tensor, spans: torch.Tensor, mask: torch.Tensor | None,
           noise: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """(the noise [sample, batch, pos, d_model] on the model's device, its std over the span): the
    seeded draw (subject_noise), or the given noise checked against (n_samples, batch, pos)."""
    if noise is None:
        noise, std = subject_noise(model, tokens, spans, cfg.n_samples, cfg.noise_scale, cfg.seed, attention_mask=mask)
        return noise, cfg.noise_scale * std
    if tuple(noise.shape[:3]) != (cfg.n_samples, *tokens.shape):
        raise ShapeMismatchError(f"noise {tuple(noise.shape)} does not match (n_samples, batch, pos) = "
                                 f"{(cfg.n_samples, *tokens.shape)}.")
    noise = noise.to(model.device)
    return noise, float(noise[:, _in_span(spans, tokens.shape[1])].std())


def _tracing_hooks(runs: list, noise: torch.Tensor, clean, window: int, n_layers: int):
    """hooks_for(chunk) for the batching engine: each run's noise sample on the embeddings and, for
    a restored run, the clean activation put back at its cell (over the window for MLP/attention)."""

    def hooks_for(chunk: range):
        samples = torch.tensor([runs[r][0] for r in chunk], device=noise.device)

        def add_noise(act: torch.Tensor, hook: Any) -> torch.Tensor:
            return (act.view(len(chunk), -1, *act.shape[1:]) + noise[samples]).reshape(act.shape)

        entries = defaultdict(list)
        for i, r in enumerate(chunk):
            if runs[r][1] is not None:
                kind, layer, pos = runs[r][1]
                for restored in window_layers(kind, layer, window, n_layers):
                    entries[site(KINDS[kind], restored)].append((i, {0: pos}))
        hooks = [(site("embed"), add_noise)]
        for name, items in entries.items():
            mask = index_mask(len(chunk), clean[name].shape[1:], items, noise.device)  # [k, pos, 1]
            hooks.append((name, replace_hook(clean[name], mask)))
        return hooks

    return hooks_for


def role_table(cells: list, ie: torch.Tensor, role_of: np.ndarray) -> pd.DataFrame:
    """Mean IE per (kind, layer, role) over every prompt's positions of that role (padding left out)."""
    rows = []
    for (kind, layer, pos), per_prompt in zip(cells, ie.numpy()):
        if pos is not None:
            rows += [{"kind": kind, "layer": layer, "role": r, "ie": float(v)}
                     for r, v in zip(role_of[:, pos], per_prompt) if r != "padding"]
    table = pd.DataFrame(rows).groupby(["kind", "layer", "role"], as_index=False)["ie"].mean()
    order = {r: i for i, r in enumerate(ROLES)}
    return table.sort_values(["kind", "layer", "role"], key=lambda c: c.map(order) if c.name == "role" else c,
                             ignore_index=True)


def peaks(df: pd.DataFrame, by_role: pd.DataFrame) -> dict[str, dict]:
    """Per kind: the single-position cell with the largest AIE, and the role with the largest mean IE."""
    out = {}
    for kind, group in df[df["pos"].notna()].groupby("kind", sort=False):
        top = group.loc[group["ie"].idxmax()]
        role_rows = by_role[by_role["kind"] == kind]
        best_role = role_rows.loc[role_rows["ie"].idxmax()]
        out[str(kind)] = {
            "layer": int(top["layer"]), "pos": int(top["pos"]), "token": str(top["token"]),
            "role": str(top["role"]), "ie": float(top["ie"]),
            "peak_role": str(best_role["role"]), "peak_role_layer": int(best_role["layer"]),
            "peak_role_ie": float(best_role["ie"]),
        }
    return out
