"""Linear probes per layer: what is linearly decodable where (the `probes` analysis).

`probe_sweep` captures one site at every layer in one forward pass, fits a cross-validated
probe per layer (LogisticProbe for class labels -> accuracy, RidgeProbe for numbers -> R^2) on
the real labels and on Hewitt & Liang's control task (a random label per word type, the type
being the token at the probed position), and reports both and their difference, selectivity.

Labels come from the Task (`task_labels`):
- "query_pair": which of the context's pairs is queried (the start of span "gold"; zoo kv);
- "span:<name>": the identity of the tokens in span <name> ("span:query" is the queried key,
  "span:subject" the facts subject);
- "span_start:<name>": where span <name> starts;
- "answer": the answer token (e.g. the subject's attribute in facts);
- "position": each token's position, probed at every position (regression);
- labels that exist for any tokenizer, each probed at every position (classification):
  "prev_token" (the previous token's id; -1 at position 0), "position_bucket" (0, 1, 2-3, 4-7,
  8-15, ...: the bit length of the position) and "word_start" (1 where the token begins a word:
  its string starts with a space marker, it is the row's first non-special token, or, for
  WordPiece, it is no "##" continuation; special tokens 0);
- or an array of one label per example.
Padded tasks (mixed lengths): positions count from each prompt's first real token, all-position
probes use real tokens only, and per-prompt labels are read at each row's own position (-1: its
answer position), so the features and labels are those of the prompts run one by one.
The default task of a non-zoo decoder is the shipped sentences probed for "position_bucket".
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

import headscope.hooks as hooks
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import Needs, Reads, one_token_answers
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.tasks import Task
from headscope.analyses.probes import scores
from headscope.errors import ConfigError, TaskError
from headscope.execution import batching
from headscope.probes import ALPHA_GRID, C_GRID, LogisticProbe, RidgeProbe, capacity_sweep, control_labels, selectivity


@dataclass(frozen=True, kw_only=True)
class ProbeData:
    """Per-example labels and control types, and which positions to read.

    all_positions: every real token of every prompt is one example, read from the flattened
    [batch * pos] activations at `real` (None: every position; padding is never an example).
    Otherwise one example per prompt, read at `positions` [batch] (padded coordinates: each row's
    own `position`, e.g. its answer position for -1)."""

    labels: np.ndarray  # [n] (real tokens when all_positions)
    types: np.ndarray  # [n] word type per example (token id at the probed position)
    kind: str  # "classification" or "regression"
    all_positions: bool
    real: np.ndarray | None = None  # [batch * pos] bool, all_positions only
    positions: torch.Tensor | None = None  # [batch] int64, per-prompt labels only
    at_mask: bool = False  # positions are each prompt's mask token (review 15c B2), not its last real token
    n_mask_prompts: int = 0  # prompts holding the mask token (mask_token given)


def real_positions(task: Task) -> torch.Tensor:
    """[batch, pos] int64: each token's position within its prompt (0 = its first real token, on
    either side of the padding), -1 on padding."""
    if task.attention_mask is None:
        return torch.arange(task.tokens.shape[1]).expand_as(task.tokens).clone()
    real = task.attention_mask.cpu().bool()
    return torch.where(real, real.long().cumsum(1) - 1, -1)


def row_positions(task: Task, position: int) -> torch.Tensor:
    """[batch] padded indices of each prompt's `position` (negative: from its last real token, so -1
    is the answer position under either padding; else from its first real token)."""
    pos = real_positions(task)  # [batch, pos]
    length = pos.max(1).values + 1  # [batch]
    want = position + length if position < 0 else torch.full_like(length, position)
    if bool(((want < 0) | (want >= length)).any()):
        raise ConfigError(f"position {position} is out of range for prompts of {int(length.min())} to "
                          f"{int(length.max())} tokens; pick a position every prompt has.")
    return (pos == want[:, None]).int().argmax(1)  # [batch]


def mask_rows(task: Task, mask_token: int | None) -> tuple[torch.Tensor | None, int]:
    """(each row's padded index of its one `mask_token`, [batch] int64, or None unless every prompt holds exactly
    one; how many prompts hold it at all). A masked LM's task puts the answer where its mask token is."""
    if mask_token is None:
        return None, 0
    hit = task.tokens.cpu() == int(mask_token)  # [batch, pos]
    if task.attention_mask is not None:
        hit &= task.attention_mask.cpu().bool()
    count = hit.sum(1)  # [batch]
    return (hit.int().argmax(1) if bool((count == 1).all()) else None), int((count > 0).sum())


def _class_ids(rows: torch.Tensor) -> np.ndarray:
    """Equal rows -> equal class id: [n, ...] -> [n]."""
    return torch.unique(rows.reshape(rows.shape[0], -1), dim=0, return_inverse=True)[1].numpy()


GENERIC_LABELS = ("prev_token", "position_bucket", "word_start")
_SPACE_MARKERS = ("\u0120", "\u2581", " ")  # byte-level BPE's "Ġ", SentencePiece's "▁", a plain space


def word_starts(tokenizer, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[batch, pos] int64: 1 where a token begins a word (see the module doc), from the token strings;
    0 on padding (mask [batch, pos], 0 = padding), which never counts as a row's first token."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pad = None if mask is None else ~mask.cpu().bool()
    ids = sorted(set(tokens.reshape(-1).tolist()))
    strings = dict(zip(ids, tokenizer.convert_ids_to_tokens(ids)))
    backend = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    wordpiece = (getattr(backend, "continuing_subword_prefix", None) or "") == "##"
    out = torch.zeros_like(tokens)
    for b, row in enumerate(tokens.tolist()):
        first = True
        for p, i in enumerate(row):
            if i in special or (pad is not None and bool(pad[b, p])):
                continue
            text = strings[i] or ""
            out[b, p] = int(first or (not text.startswith("##") if wordpiece else text.startswith(_SPACE_MARKERS)))
            first = False
    return out


def _generic_labels(task: Task, labels: str, tokenizer) -> np.ndarray:
    """[batch * pos] labels of GENERIC_LABELS for every position of every row, from each row's real
    positions (values on padding are meaningless; the caller drops them)."""
    tokens = task.tokens.cpu()
    pos = real_positions(task)  # [batch, pos], -1 on padding
    if labels == "prev_token":
        prev = torch.cat([torch.full_like(tokens[:, :1], -1), tokens[:, :-1]], dim=1)  # [batch, pos]
        y = torch.where(pos > 0, prev, -1)  # -1 at each row's first real token
    elif labels == "position_bucket":
        y = torch.where(pos > 0, torch.floor(torch.log2(pos.clamp(min=1).double())).long() + 1, 0)  # bit length
    else:
        if tokenizer is None:
            raise ConfigError("'word_start' labels need the model's tokenizer; pass tokenizer= to task_labels.")
        y = word_starts(tokenizer, tokens, task.attention_mask)
    return y.reshape(-1).numpy()


def task_labels(task: Task, labels: str | Sequence, position: int = -1, *, tokenizer=None,
                mask_token: int | None = None) -> ProbeData:
    """Labels, control types and the probe kind for a Task (see the module doc for label names;
    tokenizer: the model's, for "word_start"). Padded tasks: positions count from each row's first
    real token, all-position labels cover real tokens only, and per-prompt labels are read at each
    row's own `position` (row_positions), or, for position -1 with `mask_token` (an encoder's mask token id)
    where every prompt holds exactly one, at that token: the answer's position (mask_rows; review 15c B2)."""
    tokens = task.tokens.cpu()  # [batch, pos]
    if isinstance(labels, str) and (labels == "position" or labels in GENERIC_LABELS):
        real = None if task.attention_mask is None else task.attention_mask.cpu().reshape(-1).bool().numpy()
        keep = (lambda a: a) if real is None else (lambda a: a[real])  # noqa: E731  # [batch * pos] -> [n real]
        types = keep(tokens.reshape(-1).numpy())
        if labels == "position":
            y = real_positions(task).reshape(-1).numpy().astype(float)
            return ProbeData(labels=keep(y), types=types, kind="regression", all_positions=True, real=real)
        return ProbeData(labels=keep(_generic_labels(task, labels, tokenizer)), types=types, kind="classification",
                         all_positions=True, real=real)
    masked, n_mask = mask_rows(task, mask_token) if position == -1 else (None, 0)
    at = row_positions(task, position) if masked is None else masked  # [batch]
    where = {"at_mask": masked is not None, "n_mask_prompts": n_mask}
    types = tokens.gather(1, at[:, None])[:, 0].numpy()
    if not isinstance(labels, str):
        arr = np.asarray(labels)
        if arr.shape[0] != len(task):
            raise ConfigError(f"got {arr.shape[0]} labels for a Task of {len(task)} prompts; pass one label per prompt.")
        kind = "regression" if np.issubdtype(arr.dtype, np.floating) else "classification"
        return ProbeData(labels=arr, types=types, kind=kind, all_positions=False, positions=at, **where)
    if labels == "answer":
        if task.answers is None:
            raise ConfigError(f"Task {task.name!r} has no answers; choose another label.")
        one_token_answers(task, "probes")
        y = task.answers.cpu().numpy()
    else:
        kind, _, name = labels.partition(":")
        if labels == "query_pair":
            kind, name = "span_start", "gold"
        if kind not in ("span", "span_start") or name not in task.spans:
            raise ConfigError(
                f"unknown probe labels {labels!r} for Task {task.name!r}; use 'query_pair', 'answer', 'position', "
                f"{', '.join(repr(g) for g in GENERIC_LABELS)}, or 'span:<name>' / 'span_start:<name>' with a span of "
                f"{sorted(task.spans)}.")
        span = task.spans[name].cpu()  # [batch, 2], padded coordinates
        if kind == "span_start":  # where the span starts within its prompt
            y = _class_ids(span[:, :1] - real_positions(task).eq(0).int().argmax(1)[:, None])
        else:
            width = int((span[:, 1] - span[:, 0]).max())
            idx = (span[:, :1] + torch.arange(width)).clamp(max=tokens.shape[1] - 1)  # [batch, width]
            y = _class_ids(tokens.gather(1, idx))
    return ProbeData(labels=y, types=types, kind="classification", all_positions=False, positions=at, **where)


def probe_features(model, task: Task, site: str, probe_data: ProbeData, layers: Sequence[int]) -> list[np.ndarray]:
    """Per layer, the [n, d] activations at `site` the probes fit: every real token (all-position
    labels) or each prompt's own position, from passes of as many rows as memory holds
    (execution.batching.rows_per_pass) with the task's attention mask."""
    names = [hooks.site(site, layer) for layer in layers]
    at = probe_data.positions
    shared = at is not None and bool((at == at[0]).all())  # one index for every row: capture only it
    positions = None if at is None else ([int(at[0])] if shared else None)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    step = batching.rows_per_pass(model, task.tokens.shape[1])  # rows a pass holds (the engines' memory rule)
    for start in range(0, len(task), step):
        sl = slice(start, start + step)
        kw = {} if task.attention_mask is None else {"attention_mask": task.attention_mask[sl]}
        acts = hooks.capture(model, task.tokens[sl], names, positions=positions, to_cpu=True, **kw)
        for name in names:
            a = acts[name].float()  # [rows, pos (or 1), d]
            if at is not None and not shared:
                a = a.gather(1, at[sl, None, None].expand(-1, 1, a.shape[-1]))  # [rows, 1, d]
            parts[name].append(a)
    out = []
    for name in names:
        a = torch.cat(parts[name])  # [batch, pos (or 1), d]
        X = a.reshape(-1, a.shape[-1]).numpy()  # [n, d]
        out.append(X if probe_data.real is None else X[probe_data.real])
    return out


@torch.no_grad()
@names_source
def probe_sweep(model, task: Task | torch.Tensor | str | None = None, config: ProbesConfig | None = None,
                **config_overrides: Any) -> Result:
    """Probe accuracy (or R^2) and selectivity per layer at config.site (a site kind, e.g. "resid_post").

    task: a Task, or a [batch, pos] token tensor with labels an array (or "position"); anything
    else (None, a zoo task name, a task file) runs `run` with the config. config: a ProbesConfig
    (default here: labels "query_pair", capacity off); config_overrides are its fields (site, labels,
    position, layers, cv, seed, C, alpha, capacity, progress). The older form probe_sweep(model,
    task, site, labels=...) still works.
    capacity: False, one probe per layer (C or alpha); True, Hewitt & Liang's sweep over the
    regularisation strength (probes.C_GRID for classification, probes.ALPHA_GRID for regression;
    every other strength when quick), "coarse" (every other strength of that grid) or a grid of
    strengths: each layer reports its most selective probe (`strength` column; tables["capacity"]:
    every strength of every layer). A degenerate control task (control_degenerate) has no selectivity
    to pick a strength by: no sweep then, one probe per layer at C or alpha (summary["capacity_skipped"]
    says so).
    df: one row per (layer, fold, task in {"real", "control"}) with the score and the fold's test size
    n_test. tables["per_layer"]: per layer the score (classification: out-of-fold accuracy pooled over
    the examples, `correct` of `n`; regression: mean R^2 over folds; scores.py), its 95% interval
    (ci_low, ci_high), control and selectivity (score minus control). summary: best layer and its numbers, and
    `first_selective_layer`: the first layer whose selectivity reaches 0.5. A degenerate control task
    (control_degenerate: one label, or too few word types; n_word_types counts them) leaves every
    selectivity None (NaN in the table), with the reason in summary["control_degenerate"] (None otherwise).
    """
    if not isinstance(task, (Task, torch.Tensor)):
        return run(model, task, configure(ProbesConfig, config, config_overrides, name="probe_sweep",
                                          default=ProbesConfig.preset(), positional="site"))
    cfg = configure(ProbesConfig, config, config_overrides, name="probe_sweep", default=PROBE_SWEEP, positional="site")
    site, labels, cv, progress = cfg.site, cfg.labels, cfg.folds(), cfg.progress
    task = task if isinstance(task, Task) else Task(name="tokens", tokens=task, metric="cosine")
    probe_data = task_labels(task, labels, cfg.position, tokenizer=model.tokenizer, mask_token=encoder_mask(model))
    layers = list(range(model.facts.n_layers) if cfg.layers is None else (model.check_layer(layer) for layer in cfg.layers))
    features = probe_features(model, task, site, probe_data, layers)  # real tokens only
    labels_arr, types, features, n_dropped = _drop_singletons(probe_data, features)
    classify = probe_data.kind == "classification"
    estimator = LogisticProbe(C=cfg.C) if classify else RidgeProbe(alpha=cfg.alpha)
    score_name, param = ("accuracy", "C") if classify else ("r2", "alpha")
    full = C_GRID if classify else ALPHA_GRID
    capacity = cfg.grid()
    grid = None if capacity is None or capacity is False else (
        full if capacity is True else full[::2] if capacity == "coarse" else tuple(capacity))
    degenerate = control_degenerate(types, labels_arr, cfg.seed, model.tokenizer, classify=classify)
    skipped = None
    if degenerate is not None and grid is not None:  # no selectivity to pick a strength by: one probe per layer
        skipped = (f"selectivity is not measurable here (the control task is degenerate), so no strength is picked by it; "
                   f"each layer's probe uses {param} = {cfg.C if param == 'C' else cfg.alpha:g}, the default, not one "
                   f"chosen on the test folds")
        grid = None
    rows, per_layer, sweeps = [], [], []
    for layer, X in tqdm(list(zip(layers, features)), desc="probes", disable=not progress):
        with warnings.catch_warnings():  # many classes over few examples is expected here (e.g. 64 values)
            warnings.filterwarnings("ignore", message="The number of unique classes is greater than 50%")
            if grid is None:
                strength = cfg.C if param == "C" else cfg.alpha
                res = selectivity(estimator, X, labels_arr, types, cv=cv, seed=cfg.seed)
            else:
                sweep, folds = capacity_sweep(estimator, X, labels_arr, types, grid=grid, cv=cv, seed=cfg.seed,
                                              return_folds=True)
                sweeps.append(sweep.assign(layer=layer))
                best = int(sweep["most_selective"].to_numpy().argmax())
                strength, res = float(sweep.loc[best, "strength"]), folds[best]
        for which, scored in (("score", "n_scored"), ("control", "n_scored_control")):
            rows += [{"layer": layer, "fold": i, "task": "real" if which == "score" else "control", "score": float(s),
                      "n_test": int(n), "n_scored": int(k)}
                     for i, (s, n, k) in enumerate(zip(res[which], res["n_test"], res[scored]))]
        real, control = (scores.pooled(res[w], res[k], classify) for w, k in (("score", "n_scored"),
                                                                              ("control", "n_scored_control")))
        per_layer.append({"layer": layer, score_name: real["score"], "ci_low": real["ci_low"], "ci_high": real["ci_high"],
                          "correct": real["correct"], "n": real["n"], "control": control["score"],
                          "n_control": control["n"], "selectivity": real["score"] - control["score"],
                          "std": float(np.nanstd(res["score"])), "strength": strength})
        scored_rows, n_folds = res["scored"], res["folds"]  # which rows were scored: the labels' and folds', not the layer's
    table = pd.DataFrame(per_layer)
    if degenerate is not None:  # score minus a constant: no selectivity to report
        table["selectivity"] = np.nan
    summary = _probe_summary(table, labels_arr, cfg, classify=classify, n_dropped=n_dropped,
                             capacity={"param": param, "grid": list(grid)} if grid is not None else None,
                             degenerate=degenerate, scored=scored_rows, folds=n_folds,
                             per_row=not probe_data.all_positions)
    summary["capacity_skipped"] = skipped
    if not probe_data.all_positions:  # where each prompt was read (review 15c B2: an encoder's answer is at its mask)
        summary["read_at"] = "mask" if probe_data.at_mask else "last" if cfg.position == -1 else "position"
        summary["n_mask_prompts"] = probe_data.n_mask_prompts
        summary["mask_token"] = mask_text(model) if probe_data.n_mask_prompts else None
    summary["n_word_types"] = int(np.unique(types).shape[0])  # the control task's types at the read positions
    tables = {"per_layer": table}
    if sweeps:
        tables["capacity"] = pd.concat(sweeps, ignore_index=True)[
            ["layer", "param", "strength", "score", "control", "selectivity", "most_selective"]]
    return Result(name="probes", df=pd.DataFrame(rows), summary=summary, tables=tables,
                  config={"site": site, "labels": summary["labels"], "position": cfg.position, "cv": n_folds, "seed": cfg.seed,
                          "C": cfg.C, "alpha": cfg.alpha, "capacity": None if grid is None else list(grid),
                          "task": task.name})


def kept_examples(probe_data: ProbeData) -> np.ndarray | None:
    """[n] bool, the examples probes fit and score, or None for all: a class seen once is never both fitted
    and tested, so its example is dropped, unless fewer than two classes would remain (regression: all kept)."""
    labels_arr = probe_data.labels
    if probe_data.kind != "classification":
        return None
    _, inverse, counts = np.unique(labels_arr, return_inverse=True, return_counts=True)
    keep = counts[inverse.reshape(-1)] >= 2  # [n]
    if not (~keep).any() or len(np.unique(labels_arr[keep])) < 2:
        return None
    return keep


def _drop_singletons(probe_data: ProbeData, features: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list, int]:
    """(labels, types, features, n dropped): the examples kept_examples keeps."""
    keep = kept_examples(probe_data)
    if keep is None:
        return probe_data.labels, probe_data.types, features, 0
    return probe_data.labels[keep], probe_data.types[keep], [X[keep] for X in features], int((~keep).sum())


MIN_CONTROL_TYPES = 5  # fewer word types than this: the control task is a handful of token identities


def control_degenerate(types: np.ndarray, labels: np.ndarray, seed: int, tokenizer=None, *,
                       classify: bool = True) -> str | None:
    """Why the control task (probes.control_labels: one random label per word type) cannot measure
    selectivity, or None when it can. Hewitt & Liang's control asks how well a probe memorises a random
    label per word type, which needs many types: with k word types at the read positions the control
    labels are a function of k token identities, which any probe that tells those k words apart fits
    exactly, whatever labels the seed draws. So it is degenerate, independently of the seed, with fewer
    than MIN_CONTROL_TYPES types or (classification) at most half as many types as the real task's classes
    (the control is then a much smaller task than the one it is subtracted from; review 13b A1: prompts
    ending in " is" or " was", 2 types against 11 answers, control 1.00). Types one or two short of the
    classes are not (prev_token: every token's predecessor plus -1 at position 0). With enough types, a
    draw that still came out as one class (rare) is degenerate too."""
    kinds, counts = np.unique(types, return_counts=True)
    n_types, n_classes = int(kinds.shape[0]), int(np.unique(labels).shape[0]) if classify else None

    def word(i: int) -> str:
        return repr(tokenizer.decode([int(kinds[i])])) if tokenizer is not None else f"token id {int(kinds[i])}"

    if n_types < 2:
        return (f"every example's token at the read position is the same word type ({word(0)}), so the control task "
                f"(one random label per word type) has one label, which any probe learns exactly")
    small = n_classes is not None and 2 * n_types <= n_classes  # at most half as many types as classes
    if n_types < MIN_CONTROL_TYPES or small:
        order = np.argsort(-counts, kind="stable")
        shown = ", ".join(f"{word(i)} on {int(counts[i])}" for i in order[:4])
        more = f" and {n_types - 4} more" if n_types > 4 else ""
        against = (f", against the real task's {n_classes} classes" if small or (n_classes or 0) > n_types
                   else f", fewer than {MIN_CONTROL_TYPES}")
        return (f"the {counts.sum()} examples' tokens at the read position are only {n_types} word types "
                f"({shown}{more}){against}, so the control task (one random label per word type) is {n_types} token "
                f"identities, which any probe that tells those words apart fits exactly whatever labels are drawn; "
                f"score minus control then says nothing about memorisation")
    if np.unique(control_labels(types, labels, seed=seed)).shape[0] < 2:
        return (f"the control task's random labels for the {n_types} word types at the read positions all "
                f"came out as one class, which any probe learns exactly")
    return None


def _probe_summary(table: pd.DataFrame, labels_arr: np.ndarray, cfg: ProbesConfig, *, classify: bool, n_dropped: int,
                   capacity: dict | None, degenerate: str | None = None, scored: np.ndarray | None = None,
                   folds: int | None = None, per_row: bool = True) -> dict[str, Any]:
    """The summary's per-layer numbers: the best layer, its score, control and selectivity, the
    majority baseline and class count (classification), and the first selective layer. A degenerate
    control task (control_degenerate's reason) leaves every selectivity None, with the reason in
    `control_degenerate`. scored [n]: the rows the real task scored (linear.scoreable: a row whose class
    its fold's training part lacks is not scored); the majority baseline is over those rows, and
    n_scored / n_unscored / unscored_reason say how many and why. folds: the folds used (cv_splitter
    caps them at the largest class). per_row: one example per prompt (else per token)."""
    score_name, labels = ("accuracy" if classify else "r2"), cfg.labels
    best = table.loc[table[score_name].idxmax()]
    scored = np.ones(labels_arr.shape[0], dtype=bool) if scored is None else scored
    _, counts = np.unique(labels_arr, return_counts=True)
    _, scored_counts = np.unique(labels_arr[scored], return_counts=True)
    sel = (lambda v: None) if degenerate is not None else float  # noqa: E731
    unit = "rows" if per_row else "examples"
    what = "an answer" if labels == "answer" else "a label"
    n_unscored = int((~scored).sum())
    return {
        "labels": labels if isinstance(labels, str) else "custom", "site": cfg.site, "metric": score_name,
        "best_layer": int(best.layer), f"best_{score_name}": float(best[score_name]),
        "best_control": float(best.control), "best_selectivity": sel(best.selectivity), "best_std": float(best["std"]),
        "best_ci": [float(best.ci_low), float(best.ci_high)],
        "best_correct": None if not classify else int(best.correct),
        "score_kind": ("out-of-fold accuracy pooled over the scored examples (k of n correct, exact 95% CI)" if classify
                       else "mean R^2 over folds (95% t interval over folds)"),
        "ci_per_layer": {str(int(r.layer)): [float(r.ci_low), float(r.ci_high)] for _, r in table.iterrows()},
        "cv": folds or cfg.folds(), "cv_requested": cfg.folds(),
        "majority_baseline": float(scored_counts.max() / scored_counts.sum()) if classify and scored.any() else None,
        f"{score_name}_per_layer": {str(int(r.layer)): float(r[score_name]) for _, r in table.iterrows()},
        "selectivity_per_layer": {str(int(r.layer)): sel(r.selectivity) for _, r in table.iterrows()},
        "control_degenerate": degenerate,
        "n_examples": int(labels_arr.shape[0]), "n_dropped_single_examples": n_dropped,
        "dropped_reason": (f"{n_dropped} {'have' if n_dropped > 1 else 'has'} {what} no other "
                           f"{'row' if per_row else 'example'} has" if n_dropped else None),
        "example_unit": unit,
        "n_scored": int(scored.sum()), "n_unscored": n_unscored,
        "unscored_reason": (f"{n_unscored} {'have' if n_unscored > 1 else 'has'} {what} absent from the training part "
                            f"of the fold that tests {'them' if n_unscored > 1 else 'it'}, which no probe can predict"
                            if n_unscored else None),
        "n_scored_control": None if not classify else int(best.n_control),
        "n_classes": int(len(counts)) if classify else None,
        "capacity": capacity,
        "strength_per_layer": {str(int(r.layer)): float(r.strength) for _, r in table.iterrows()},
        "first_selective_layer": None if degenerate is not None else next(
            (int(r.layer) for _, r in table.iterrows() if r.selectivity >= 0.5), None),
    }


# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=True, labels=True, min_classes=2, min_examples=5,
              what="decodes the answer at every layer with cross-validated probes")


@dataclass(frozen=True, kw_only=True)
class ProbesConfig(AnalysisConfig):
    """site: the site kind probed at every layer; labels: what is decoded (see task_labels; the
    default "answer" is the answer a zoo Task's prompt retrieves; or an array of labels); position:
    the token read (-1: the answer position); layers: None for every layer; cv: folds (None: 5, 3 when quick);
    C / alpha: the logistic / ridge probes' regularisation when capacity is False; capacity: sweep the
    regularisation (Hewitt & Liang) and report each layer's most selective probe (quick: every other
    strength of the grid)."""

    site: str = "resid_post"
    labels: str | Sequence = "answer"
    position: int = -1
    layers: Sequence[int] | None = None
    cv: int | None = None
    C: float = 1.0
    alpha: float = 1.0
    capacity: bool | str | Sequence[float] = True
    min_examples: ClassVar[int] = 3  # cross-validation's fewest folds (answer labels: one sample an example)

    def grid(self) -> bool | str | Sequence[float]:
        """The capacity sweep: False (one probe per layer), True (the full grid; quick: "coarse", every
        other strength), "coarse" or a grid of strengths as given."""
        if self.capacity is None or self.capacity is False:
            return False
        return ("coarse" if self.quick else True) if self.capacity is True else self.capacity

    def folds(self) -> int:
        """Cross-validation folds: cv, else 5 (3 when quick)."""
        return self.cv or (3 if self.quick else 5)


def reads(model, config: ProbesConfig | None = None, summary: Any = None) -> Reads:
    """What probes read of a task (contract.Reads): the prompts, and the answers as class labels where the
    labels are "answer" (summary["labels"]: what the run used), read at config.position; never the
    corrupted prompts."""
    config = config or ProbesConfig.preset()
    labels = (summary or {}).get("labels", config.labels if isinstance(config.labels, str) else "custom")
    read_at = (summary or {}).get("read_at")
    mask = mask_text(model) or "[MASK]"
    if config.position == -1 and model.facts.is_encoder and read_at == "mask":
        where = (f"each prompt's {mask} token, where its answer goes (every prompt holds one; the control task sees "
                 "one word type there)")
    elif config.position == -1:
        where = (f"each prompt's last real token, which on an encoder is its [SEP] or </s> (one read position for "
                 f"every family, the whole prompt attended to; a prompt's {mask} is read instead only where every "
                 "prompt holds exactly one; the control task sees one word type there)"
                 if model.facts.is_encoder else "the answer position (each prompt's end)")
    else:
        where = f"token {config.position} of each prompt"
    if labels == "answer":
        return Reads(answers_as="as class labels", why="probes decode the answer from each prompt alone",
                     metric=f"out-of-fold accuracy of a linear probe per layer predicting the answer from the "
                            f"{config.site} activations at {where}, against a control task")
    return Reads(answers=False, why=f"these probes decode {labels!r} labels",
                 metric=f"a linear probe per layer predicting {labels!r} labels from the {config.site}, against a "
                        "control task")


def encoder_mask(model) -> int | None:
    """The mask token id probes read an encoder's prompts at (task_labels), None on a decoder or without one."""
    if not model.facts.is_encoder:
        return None
    mask = getattr(model.tokenizer, "mask_token_id", None)
    return None if mask is None else int(mask)


def mask_text(model) -> str | None:
    """The tokenizer's mask token as text ("[MASK]", "<mask>")."""
    return getattr(model.tokenizer, "mask_token", None)


PROBE_SWEEP = ProbesConfig(labels="query_pair", capacity=False)  # probe_sweep's default: one probe per layer


def probe_data(model, task: Task | str | None = None, config: ProbesConfig | None = None) -> tuple[Task, Any]:
    """(the Task, the labels) `run` probes: the given task with config.labels, else the family's
    default (see `run`)."""
    from headscope.analyses.core import default_tasks
    from headscope.analyses.core.task_files import resolve_task
    from headscope.analyses.core.tasks import sentence_task, zoo

    config = config or ProbesConfig.preset()
    n = config.examples(256, 64)
    if model.facts.is_encoder and task is None:
        return sentence_task(model, n_examples=n, seed=config.seed), "position"
    if task is None:
        try:
            task = zoo(model, "kv", n_examples=n, seed=config.seed)
        except TaskError:  # not a zoo vocabulary: the shipped sentences, labels any tokenizer has
            labels = "position_bucket" if config.labels == "answer" else config.labels
            return default_tasks.text_task(model, n, config.seed, padded=True), labels
    return resolve_task(model, task, default="kv", n_examples=n, seed=config.seed), config.labels


def probed_task(model, task: Task | str | None = None, config: ProbesConfig | None = None) -> Task:
    """The rows `run` fits and scores (its section's provenance and sample, the explorer's prompts): probe_data's
    Task less the rows kept_examples drops (per-prompt labels; all-position labels keep every row)."""
    config = config or ProbesConfig.preset()
    task, labels = probe_data(model, task, config)
    data = task_labels(task, labels, config.position, tokenizer=model.tokenizer, mask_token=encoder_mask(model))
    keep = None if data.all_positions else kept_examples(data)
    return task if keep is None else task.rows(torch.from_numpy(np.flatnonzero(keep)))


def run(model, task: Task | str | None = None, config: ProbesConfig | None = None) -> Result:
    """`headscope probes`: the answer a zoo Task's prompt retrieves (kv: the queried key's value), read at
    the answer position, per layer (also for task files); encoders: token position over the shipped
    sentences; other decoders: the shipped sentences (default_tasks.text_task) with "position_bucket"
    labels (or config.labels when set to another label). (The queried key itself is the input token
    there, so its control task is as easy as the real one: selectivity 0 by construction; "span:query"
    shows it.)"""
    config = config or ProbesConfig.preset()
    task, labels = probe_data(model, task, config)
    return probe_sweep(model, task, dataclasses.replace(config, labels=labels))
