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

Expected shape on factual recall: MLP peaks at the last subject token in middle layers; a late
peak at the last token.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope.analyses.core.result import Result
from headscope.analyses.patching.engine import index_mask, replace_hook, run_batched
from headscope.analyses.patching.inputs import resolve_metric, token_labels
from headscope.errors import ConfigError
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


def roles(span: torch.Tensor, n_pos: int) -> np.ndarray:
    """[batch, 2] half-open subject spans -> [batch, pos] role names (Meng et al.'s token groups)."""
    out = np.empty((span.shape[0], n_pos), dtype=object)
    for b, (start, end) in enumerate(span.tolist()):
        for p in range(n_pos):
            if p == n_pos - 1:
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
                  seed: int) -> tuple[torch.Tensor, float]:
    """Seeded noise [sample, batch, pos, d_model], zero outside the span; and its std."""
    n_prompts, n_pos = tokens.shape
    positions = torch.arange(n_pos)
    in_span = (positions >= span[:, :1]) & (positions < span[:, 1:])  # [batch, pos]
    embed = capture(model, tokens, [site("embed")])[site("embed")].cpu()  # [batch, pos, d_model]
    std = float(embed[in_span].std())
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n_samples, n_prompts, n_pos, embed.shape[-1], generator=gen)  # [sample, batch, pos, d_model]
    noise = noise * (scale * std) * in_span[None, :, :, None]
    return noise.to(model.device, embed.dtype), std


def causal_tracing(
    model,
    task,
    *,
    kinds: Sequence[str] = ("resid", "mlp", "attn"),
    span: str = "subject",
    n_samples: int = 10,
    noise_scale: float = 3.0,
    window: int | None = None,
    metric: Any = "prob",
    seed: int = 0,
    batch_size: int | None = None,
    memory_budget: int | None = None,
    progress: bool = False,
) -> Result:
    """Causal tracing of `task` (needs task.spans[span]) with per-(kind, layer, position) AIEs.

    Returns a Result: df (and tables["causal_tracing"]) with kind, layer, pos, token, role
    (of the first prompt), ie (AIE) and restored (the mean metric after restoring);
    tables["causal_tracing_roles"] averages IEs per (kind, layer, role) over prompts; summary
    has clean/corrupted metric, the noise std and the peak cell of each kind.
    """
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ConfigError(f"Unknown causal-tracing kinds {unknown}; choose from {tuple(KINDS)}.")
    if span not in task.spans:
        raise ConfigError(f"Task {task.name!r} marks no {span!r} span (it has {sorted(task.spans)}); "
                         "causal tracing noises the subject tokens, so pass span= or add the span.")
    if n_samples < 1:
        raise ConfigError(f"n_samples must be >= 1, got {n_samples}.")
    tokens = model.check_tokens(task.tokens)
    pm = resolve_metric(task, metric)
    n_layers, n_pos = model.facts.n_layers, tokens.shape[1]
    window = default_window(n_layers) if window is None else int(window)
    spans = task.spans[span].cpu()
    noise, std = subject_noise(model, tokens, spans, n_samples, noise_scale, seed)
    clean = capture(model, tokens, [site(KINDS[k], layer) for k in kinds for layer in range(n_layers)])
    cells = [(k, layer, p) for k in kinds for layer in range(n_layers) for p in [*range(n_pos), None]]
    runs = [(s, cell) for s in range(n_samples) for cell in [None, *cells]]  # None: corrupted baseline

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

    values = run_batched(model, tokens, len(runs), hooks_for, pm.fn, batch_size=batch_size,
                         memory_budget=memory_budget, progress=progress, stacked_metric=pm.stacked, desc="causal tracing")
    values = values.view(n_samples, len(cells) + 1, -1)  # [sample, 1 + cell, batch]
    corrupt = values[:, 0]  # [sample, batch]
    ie = (values[:, 1:] - corrupt[:, None]).mean(0)  # [cell, batch]
    restored = values[:, 1:].mean((0, 2))  # [cell]
    clean_value = float(pm.fn(clean.output).mean())
    labels = token_labels(model, tokens)
    role_of = roles(spans, n_pos)  # [batch, pos]
    df = pd.DataFrame({
        "kind": [c[0] for c in cells],
        "layer": [c[1] for c in cells],
        "pos": pd.array([c[2] for c in cells], dtype="Int64"),
        "token": [labels[c[2]] if c[2] is not None else "all" for c in cells],
        "role": [role_of[0, c[2]] if c[2] is not None else "all" for c in cells],
        "ie": ie.mean(1).double().numpy(),
        "restored": restored.double().numpy(),
    })
    by_role = role_table(cells, ie, role_of)
    summary = {
        "metric": pm.name,
        "span": span,
        "clean_metric": clean_value,
        "corrupted_metric": float(corrupt.mean()),
        "noise_std": noise_scale * std,
        "n_samples": n_samples,
        "window": window,
        "n_examples": int(tokens.shape[0]),
        "peaks": peaks(df, by_role),
    }
    config = {"kinds": list(kinds), "span": span, "n_samples": n_samples, "noise_scale": noise_scale,
              "window": window, "seed": seed}
    return Result(name="patching", df=df, summary=summary,
                  tables={"causal_tracing": df, "causal_tracing_roles": by_role}, config=config)


def role_table(cells: list, ie: torch.Tensor, role_of: np.ndarray) -> pd.DataFrame:
    """Mean IE per (kind, layer, role) over every prompt's positions of that role."""
    rows = []
    for (kind, layer, pos), per_prompt in zip(cells, ie.numpy()):
        if pos is not None:
            rows += [{"kind": kind, "layer": layer, "role": r, "ie": float(v)} for r, v in zip(role_of[:, pos], per_prompt)]
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
