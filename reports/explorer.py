"""The interactive attention explorer: the data it shows, captured from a model.

`attention_explorer_data(model, prompts)` captures every layer's attention pattern
(`blocks.L.attn.hook_pattern`) for a few examples, one forward pass per example (padding
removed), and returns a JSON-ready dict; `explorer_html(data)` (reports/explorer_view.py) draws
it as a self-contained HTML fragment; `show_attention(model, prompt_or_task)` wraps both for
notebooks; `write_explorer_data(model, out, task)` writes OUT/explorer.json during a report run,
which `html_report` embeds in report.html (the report itself never computes).

The data dict (format 1):

    model, family, n_layers, n_heads, n_kv_heads, is_encoder, kv_note (heads sharing K/V only: kv_note's words)
    scale:     patterns are stored as integers, round(p * scale) (scale 10000: 4 decimals)
    examples:  [{tokens: [str], text (the shown tokens decoded: the prompt list's label), n_tokens_total, truncated
                 (with positions, each shown token's place in the prompt, and cut [first, last]: a longer prompt shows
                 its first token and its end, attention_capture.kept_positions),
                 task (the task's label), answer_from (rows of a several-token answer: the index of its first
                 teacher-forced piece, shown marked "answer, teacher-forced"; with prompt_text and answer_text),
                 patterns: [layer][head][query] -> [int] (row of keys, trailing zeros dropped)}]
               attribution (in a report whose attribution analysis ran on this example's tokens):
               {method: [score per token]} from OUT/attribution/token_scores.csv
               the examples of tokens_or_prompts first, then those of `more_tasks` (a report's other
               tasks: a few examples each while the stored values stay under MAX_VALUES)
    scores:    {name: [layer][head] -> float or None}, the grid's colour; always "max attention
               (examples shown)" (mean over queries of the largest weight) and "sink (examples
               shown)" (mean over the queries that can see the first token of the weight on it; a
               decoder's first query, which can only attend to itself, left out); plus the caller's
    labels:    {name: [layer][head] -> str} (e.g. each head's role), shown in the grid
    default_score: the score the grid starts coloured by
    learned_sinks: (only where the model has them: GPT-OSS) true: each row's weights over the keys sum to less than 1
    windows:   (only when a layer slides) [layer] -> its sliding window or null (global): a query q sees keys
               k > q - window; the view hatches the keys outside it (masked, not zero attention), says the
               window of the layer shown, and averages the sink over the queries that see the first token
               (as the "sink (examples shown)" score does)
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from headscope.analyses.core.attention_capture import SCALE, Captured, capture_examples, example_rows, kept_positions
from headscope.errors import ConfigError
from headscope.hooks import capture, site
from headscope.models.hooked_model import layer_windows
from headscope.reports.explorer_view import explorer_html, muted_scores, under_floor
from headscope.reports.heads_words import lead_ablation
from headscope.reports.html_report import EXPLORER_FILE
from headscope.reports.tokens_view import HTMLView, pattern_view

FORMAT = 1
MAX_ATTENTION = "max attention (examples shown)"  # mean over queries of the largest weight
SINK = "sink (examples shown)"  # mean over queries of the weight on the first token
FIRST = "first token (examples shown)"  # the same on a model with learned sinks (review 19b A2)
LEARNED = "learned sink (examples shown)"  # mean over queries of 1 - the row's sum over the keys


def _learned_share(examples: Sequence[Mapping[str, Any]], n_layers: int, n_heads: int) -> torch.Tensor | None:
    """[n_layers, n_heads] the learned sinks' share of a row (1 - its sum over the keys), mean over the shown queries
    and the examples not cut (a cut example's rows miss the cut keys); None where every example is cut."""
    whole = [e for e in examples if not e.get("cut")]
    if not whole:
        return None
    out = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    for e in whole:
        for layer in range(n_layers):
            for head in range(n_heads):
                rows = e["patterns"][layer][head]  # [query] -> [int] (x SCALE)
                out[layer, head] += sum(1 - sum(r) / SCALE for r in rows) / max(len(rows), 1)
    return out / len(whole)


# ---- scores --------------------------------------------------------------------------------
def _grid(values: Any, n_layers: int, n_heads: int, name: str) -> list[list[Any]]:
    """A [n_layers][n_heads] list of floats (None for NaN) or strings from an array-like."""
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    rows = [list(r) for r in (values.tolist() if hasattr(values, "tolist") else values)]
    if len(rows) != n_layers or any(len(r) != n_heads for r in rows):
        raise ConfigError(f"head score {name!r} must have shape [n_layers={n_layers}, n_heads={n_heads}].")
    if all(isinstance(v, str) for r in rows for v in r):
        return rows
    out = []
    for r in rows:
        # 6 significant digits, not decimals: a score of 1e-7 (a gradient in bfloat16) must not read 0
        out.append([None if v is None or float(v) != float(v) else float(f"{float(v):.6g}") for v in r])
    return out


def _frame_scores(df: Any) -> dict[str, Any]:
    """Per-head columns of a DataFrame with layer and head columns (e.g. the heads analysis's
    results: one importance column per method, role scores, the role)."""
    from pandas.api import types

    out: dict[str, Any] = {}
    if "method" in df.columns and "importance" in df.columns:
        for method, part in df.groupby("method", sort=True):
            out[f"importance ({method})"] = part[["layer", "head", "importance"]]
        df = df[df["method"] == df["method"].iloc[0]]
    for col in df.columns:
        if col in ("layer", "head", "head_name", "method", "rank", "importance", "importance_se", "importance_layer_norm",
                   "positional_offset"):
            continue
        if types.is_numeric_dtype(df[col]) and not types.is_bool_dtype(df[col]) or types.is_string_dtype(df[col]):
            out[col] = df[["layer", "head", col]]
    return out


def _score_grids(head_scores: Any, n_layers: int, n_heads: int) -> tuple[dict, dict]:
    """({name: numeric grid}, {name: label grid}) from a mapping of array-likes or a DataFrame."""
    if head_scores is None:
        return {}, {}
    if hasattr(head_scores, "columns"):
        head_scores = _frame_scores(head_scores)
    elif not isinstance(head_scores, Mapping):
        head_scores = {"score": head_scores}
    scores, labels = {}, {}
    for name, values in head_scores.items():
        if hasattr(values, "columns"):  # a long table: layer, head, value
            col = [c for c in values.columns if c not in ("layer", "head")][0]
            grid: list[list[Any]] = [[None] * n_heads for _ in range(n_layers)]
            for l, h, v in zip(values["layer"], values["head"], values[col]):
                if 0 <= int(l) < n_layers and 0 <= int(h) < n_heads:
                    grid[int(l)][int(h)] = v if isinstance(v, str) else (None if v != v else float(v))
            values = grid
            if all(v is None or isinstance(v, str) for r in grid for v in r) and any(isinstance(v, str) for r in grid for v in r):
                labels[str(name)] = [["" if v is None else v for v in r] for r in grid]
                continue
        grid = _grid(values, n_layers, n_heads, str(name))
        if any(isinstance(v, str) for r in grid for v in r):
            labels[str(name)] = [[str(v) for v in r] for r in grid]
        else:
            scores[str(name)] = grid
    return scores, labels


def attention_explorer_data(model, tokens_or_prompts: Any = None, *, max_examples: int = 3, max_tokens: int = 64,
                            head_scores: Any = None, default_score: str | None = None, seed: int = 0,
                            more_tasks: Mapping[str, Any] | None = None, more_examples: int = 2) -> dict[str, Any]:
    """The explorer's data: every layer's attention pattern on up to `max_examples` examples.

    tokens_or_prompts: a prompt or list of prompts, a [batch, pos] token tensor, a Task, a zoo
    task name or task file (None: the model's default task, as the heads analysis picks it).
    Each example keeps its first `max_tokens` tokens (a decoder's patterns over them are those of
    the whole prompt). head_scores colours the grid: an array-like [n_layers, n_heads], a mapping
    of such (strings become labels, e.g. roles), or a DataFrame with layer and head columns (the
    heads analysis's results). Patterns are rounded to 4 decimals (see the module docstring).
    seed: the seed of a generated task (a zoo task name or None), as the analyses use it.
    more_tasks: {label: task} of other tasks to show (a report's: each analysis's own), up to
    `more_examples` examples each, added while the stored values stay under MAX_VALUES.
    """
    captured = capture_examples(model, tokens_or_prompts, max_examples=max_examples, max_tokens=max_tokens, seed=seed,
                                more_tasks=more_tasks, more_examples=more_examples)
    return explorer_data(model.facts, captured, head_scores=head_scores, default_score=default_score,
                         windows=layer_windows(model))


def explorer_data(f: Any, captured: Captured, *, head_scores: Any = None, default_score: str | None = None,
                  windows: Sequence[int | None] | None = None) -> dict[str, Any]:
    """The explorer's data dict (format 1, the module docstring) from captured patterns
    (analyses/core/attention_capture.py) and the model's facts `f`; head_scores and default_score
    as in attention_explorer_data; windows: each layer's sliding window (models.layer_windows), kept
    only when a layer slides. Draws nothing new: the patterns come as captured."""
    examples, sink, peak, source = captured.examples, captured.sink, captured.peak, captured.source
    n = max(len(examples), 1)
    scores: dict[str, Any] = {}
    user_scores, labels = _score_grids(head_scores, f.n_layers, f.n_heads)
    scores.update(user_scores)
    scores[MAX_ATTENTION] = _grid(peak / n, f.n_layers, f.n_heads, MAX_ATTENTION)
    learned = bool(getattr(f, "learned_sinks", False))  # review 19b A2: the first token is not the learned sink there
    scores[FIRST if learned else SINK] = _grid(sink / n, f.n_layers, f.n_heads, FIRST if learned else SINK)
    if learned and (share := _learned_share(examples, f.n_layers, f.n_heads)) is not None:
        scores[LEARNED] = _grid(share, f.n_layers, f.n_heads, LEARNED)
    if default_score is None:
        default_score = next(iter(user_scores), MAX_ATTENTION)
    elif default_score not in scores:
        raise ConfigError(f"default_score {default_score!r} is not one of the scores {sorted(scores)}.")
    return {
        "format": FORMAT, "model": f.name, "family": f.family, "source": source,
        "n_layers": f.n_layers, "n_heads": f.n_heads, "n_kv_heads": f.n_kv_heads, "is_encoder": f.is_encoder,
        **({"kv_note": note} if (note := kv_note(f.n_heads, f.n_kv_heads)) else {}),
        "scale": SCALE, "examples": examples, "scores": scores, "labels": labels, "default_score": default_score,
        **({"windows": [int(w) if w else None for w in windows]} if windows and any(windows) else {}),
        # review 19b A2: a learned sink logit per head takes part of each row (rows over the keys sum to < 1)
        **({"learned_sinks": True} if getattr(f, "learned_sinks", False) else {}),
    }


def kv_note(n_heads: int, n_kv_heads: int) -> str | None:
    """The grid's note on heads that share keys and values, None under multi-head attention: "Grouped by KV head:
    all 6 query heads share one K/V head (multi-query)." or "... each of the 2 K/V heads is shared by 3 query heads
    (grouped-query)." (review 17b C4: "6 query heads share each of 1 KV heads")."""
    if not 0 < n_kv_heads < n_heads or n_heads % n_kv_heads:
        return None
    if n_kv_heads == 1:
        return f"Grouped by KV head: all {n_heads} query heads share one K/V head (multi-query)."
    return (f"Grouped by KV head: each of the {n_kv_heads} K/V heads is shared by {n_heads // n_kv_heads} query heads "
            "(grouped-query).")


def pattern_from_data(data: Mapping[str, Any], example: int, layer: int, head: int) -> list[list[float]]:
    """The stored pattern [query][key] of one head on one example, as floats (zeros restored)."""
    ex = data["examples"][example]
    n = len(ex["tokens"])
    rows = ex["patterns"][layer][head]
    return [[v / data["scale"] for v in r] + [0.0] * (n - len(r)) for r in rows]


# ---- notebooks and reports -----------------------------------------------------------------
class AttentionExplorer:
    """The explorer for notebooks: displays itself; `.data` is the dict, `.html()` the fragment. Made by
    show_attention, it displays in a live kernel with a prompt box (reports/prompt_box.py): rebuild(prompt)
    makes the explorer on a typed prompt."""

    def __init__(self, data: dict[str, Any], rebuild: Callable[[str], AttentionExplorer] | None = None) -> None:
        self.data = data
        self._rebuild = rebuild

    def html(self) -> str:
        return explorer_html(self.data)

    def _repr_html_(self) -> str:
        return self.html()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from headscope.reports.prompt_box import notebook_bundle

        return notebook_bundle(self, self._rebuild)

    def prompt_box(self) -> Any:
        """The notebook's prompt box over this explorer (a PromptBox; `.box` is the widget); needs ipywidgets."""
        from headscope.reports.prompt_box import PromptBox

        if self._rebuild is None:
            raise ConfigError("this explorer has no prompt box: make it with hs.show_attention(model, prompt).")
        return PromptBox(self._rebuild, self)

    def save(self, path: str | Path) -> Path:
        """A standalone HTML page holding the explorer."""
        from headscope.reports import io

        page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>attention explorer</title>"
                f"</head><body>{self.html()}</body></html>")
        return io.write_text(Path(path), page)

    def __repr__(self) -> str:
        d = self.data
        return (f"AttentionExplorer({d['model']}: {d['n_layers']} layers x {d['n_heads']} heads, "
                f"{len(d['examples'])} example(s))")


def show_attention(model, prompt_or_task: Any = None, *, layer: int | None = None, heads: int | Sequence[int] | None = None,
                   max_examples: int = 3, max_tokens: int = 64, head_scores: Any = None, default_score: str | None = None,
                   seed: int = 0, prompt_box: bool = True) -> AttentionExplorer | HTMLView:
    """Attention patterns for notebooks (each displays itself).

    show_attention(model, prompt_or_task): the interactive explorer of every head (prompt_or_task: a
      prompt, a list of prompts, a token tensor, a Task, a zoo task name or task file; head_scores:
      per-head values that colour the grid, see attention_explorer_data); in a live notebook kernel with
      ipywidgets it has a prompt box: type a prompt, press Enter, the explorer shows it (prompt_box=False: none);
    show_attention(model, prompt, layer=L, heads=[h, ...]): layer L's patterns on the prompt (its first
      example), one grid per head (heads: default every head of the layer; negative indices count back);
    show_attention(pattern, tokens): patterns [head, query, key] (or [query, key]) over string tokens,
      CircuitsVis's shape, e.g. `acts[hs.site("pattern", 1)][0]` and `model.to_str_tokens(tokens)`."""
    if hasattr(model, "shape") and not hasattr(model, "facts"):  # a pattern tensor or array
        if prompt_or_task is None:
            raise ConfigError("show_attention(pattern, tokens): give the pattern's tokens as strings.")
        if layer is not None or heads is not None:
            raise ConfigError("layer= and heads= choose what to capture from a model; slice a pattern tensor yourself.")
        return pattern_view(model, [str(t) for t in prompt_or_task])
    if layer is None and heads is None:
        def explorer(source: Any) -> AttentionExplorer:
            return AttentionExplorer(attention_explorer_data(
                model, source, max_examples=max_examples, max_tokens=max_tokens, head_scores=head_scores,
                default_score=default_score, seed=seed), rebuild)

        def rebuild(prompt: str) -> AttentionExplorer:  # a typed prompt is text, never a task name
            return explorer([prompt])

        return explorer(prompt_or_task) if prompt_box else AttentionExplorer(explorer(prompt_or_task).data)
    f = model.facts
    layer = 0 if layer is None else int(layer)
    if not -f.n_layers <= layer < f.n_layers:
        raise ConfigError(f"layer {layer} is out of range for {f.name}'s {f.n_layers} layers.")
    layer %= f.n_layers
    chosen = list(range(f.n_heads)) if heads is None else [int(h) for h in ([heads] if isinstance(heads, int) else heads)]
    bad = [h for h in chosen if not -f.n_heads <= h < f.n_heads]
    if bad or not chosen:
        raise ConfigError(f"heads {bad or chosen} are out of range for {f.n_heads} heads per layer.")
    row = example_rows(model, prompt_or_task, 1, seed)[0][0].reshape(1, -1)  # [1, pos]
    kept = kept_positions(row.shape[1], max_tokens)  # a long prompt: its first token and its end (review 14c C5)
    with torch.no_grad():
        acts = capture(model, model.check_tokens(row), [site("pattern", layer)], positions=kept, to_cpu=True)
    pattern = acts[site("pattern", layer)][0].float()[[h % f.n_heads for h in chosen]][..., kept]  # [heads, q, k]
    tokens = [str(t) for t in model.to_str_tokens(row[0, kept])]
    return pattern_view(pattern, tokens, labels=[f"L{layer}H{h % f.n_heads}" for h in chosen],
                        title=f"{f.name}, layer {layer}", window=layer_windows(model)[layer], layer=layer,
                        sinks=bool(getattr(f, "learned_sinks", False)),
                        positions=kept, n_total=row.shape[1])


def _heads_results(out: Path) -> Any:
    """OUT/heads/results.csv (importance per method, role scores, roles) when the heads analysis ran."""
    csv = Path(out) / "heads" / "results.csv"
    if not csv.exists():
        return None
    import pandas as pd

    try:
        df = pd.read_csv(csv)
    except (OSError, ValueError):
        return None
    return df if {"layer", "head"} <= set(df.columns) else None


IMPORTANCE_ORDER = ("importance (gradient)", "importance (zero)", "importance (mean)", "importance (resample)")


def opening_score(names: Any, heads_summary: Mapping[str, Any] | None) -> str | None:
    """The importance the grid opens on: the ablation the heads finding leads with (heads_words.lead_ablation; review
    13c B2: MiniLM's opened on the contrastive-loss gradient while its finding named the zero-ablation heads), else
    gradient, else an ablation, skipping one the heads summary mutes (explorer_view.muted_scores: under its numerical
    floor; review 11b B2); where every one is muted (at chance) the first not under its floor, else the first present;
    None without importance."""
    present = [n for n in IMPORTANCE_ORDER if n in names]
    muted = muted_scores(present, heads_summary)
    lead = lead_ablation(heads_summary) if isinstance(heads_summary, Mapping) else None
    if lead and f"importance ({lead})" in present and f"importance ({lead})" not in muted:
        return f"importance ({lead})"
    # every one muted (at chance): one not also under its numerical floor (review 15a C2: Granite bf16 opened on a
    # gradient whose predicted loss changes the heads section had put under its floor)
    return next((n for n in present if n not in muted), next((n for n in present if not under_floor(n, heads_summary)),
                                                               present[0] if present else None))


def _heads_summary(out: Path) -> Mapping[str, Any] | None:
    """OUT/heads/summary.json, or None when absent or unreadable."""
    try:
        summary = json.loads((out / "heads" / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, Mapping) else None


def _ig_rule(out: Path) -> Any:
    """The attribution summary's IG rule (analyses/attribution/convergence.py `ig_use`): which examples' integrated
    gradients colour tokens; every example's where OUT/attribution/summary.json cannot be read."""
    from headscope.analyses.attribution.convergence import ig_use

    try:
        summary = json.loads((out / "attribution" / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    return ig_use(summary if isinstance(summary, dict) else {})


def _attach_attribution(data: dict[str, Any], out: Path) -> None:
    """Give each example the attribution analysis's token scores of the example with the same tokens
    (OUT/attribution/token_scores.csv: example, position, token, method, score), when there is one."""
    csv = out / "attribution" / "token_scores.csv"
    if not csv.exists():
        return
    import pandas as pd

    try:
        df = pd.read_csv(csv, keep_default_na=False, dtype={"token": str})
    except (OSError, ValueError):
        return
    if not {"example", "position", "token", "method", "score"} <= set(df.columns):
        return
    df = _ig_rule(out).rows(df)  # an example whose IG does not add up to the metric change: not IG's colouring
    if df.empty:
        return
    by_tokens = {}
    for _, part in df.groupby("example", sort=True):
        first = part[part["method"] == part["method"].iloc[0]].sort_values("position")
        tokens = tuple(str(t) for t in first["token"])
        scores = {str(m): [round(float(v), 6) for v in g.sort_values("position")["score"]]
                  for m, g in part.groupby("method", sort=True)}
        by_tokens.setdefault(tokens, scores)
    for ex in data["examples"]:
        scores = by_tokens.get(tuple(ex["tokens"]))
        if scores and all(len(v) == len(ex["tokens"]) for v in scores.values()):
            ex["attribution"] = scores


def write_explorer_data(model, out: str | Path, task: Any = None, *, seed: int = 0, max_examples: int = 3,
                        max_tokens: int = 64, more_tasks: Mapping[str, Any] | None = None,
                        captured: Captured | None = None) -> Path:
    """Write the explorer's data as OUT/explorer.json (atomically); returns the path. captured: the
    patterns the runner captured (analyses/core/runner.py explorer_capture; a report computes nothing
    here); without it they are captured from `task` (None, a zoo task name, a task file or a Task;
    seed: the run's seed, which picks a generated task's examples as the analyses do). The
    grid is coloured by the heads analysis's importance (`opening_score`; it offers its role scores and roles)
    when OUT/heads/results.csv exists, else by each head's largest attention weight. more_tasks:
    {label: Task} of the other tasks the report's analyses ran on, a few examples each. An example
    the attribution analysis scored (OUT/attribution/token_scores.csv, same tokens) carries its scores."""
    from headscope.reports import io

    scores = _heads_results(Path(out))
    default = None
    if scores is not None:
        default = opening_score(_frame_scores(scores), _heads_summary(Path(out)))
    if captured is None:
        captured = capture_examples(model, task, max_examples=max_examples, max_tokens=max_tokens, seed=seed,
                                    more_tasks=more_tasks)
    data = explorer_data(model.facts, captured, head_scores=scores, default_score=default, windows=layer_windows(model))
    _attach_attribution(data, Path(out))
    path = Path(out) / EXPLORER_FILE
    io.write_text(path, json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n")
    return path


__all__ = [
    "AttentionExplorer", "EXPLORER_FILE", "attention_explorer_data", "explorer_data", "explorer_html", "pattern_from_data",
    "show_attention", "write_explorer_data",
]
