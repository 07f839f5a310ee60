"""Notebook views of one prompt: scores on its tokens (`show_tokens`) and attention patterns of
chosen heads (`pattern_view`, used by `show_attention(model, prompt, layer=, heads=)` and
`show_attention(pattern, tokens)`).

Both are self-contained HTML (no script, nothing fetched; the patterns carry the explorer's stylesheet, scoped to
.hsx); every token string and label is escaped. Scores use a diverging colour map centred on 0 (red positive, blue negative,
opacity |score| / max |score|), so a negative attribution is never clipped away; every token is shown.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from headscope.errors import ConfigError
from headscope.reports.render import escape

POSITIVE = (200, 40, 30)  # red
NEGATIVE = (30, 90, 210)  # blue
TOKEN_METHODS = ("integrated_gradients", "grad_x_input", "saliency")  # attribution's token_scores, signed first
# review 18e C2: the attribution's other methods, from its scores table (ranked tokens only: shares summing to 1)
RANKED_METHODS = ("leave_one_out", "last_layer", "rollout")
RANKED_LABELS = {"leave_one_out": "leave_one_out (share)", "last_layer": "last-layer attention (share)",
                 "rollout": "rollout (share)"}


def _numbers(values: Any, what: str) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    try:
        out = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be numbers (a tensor, array or list), got {type(values).__name__}.") from None
    return out


def colour(value: float, scale: float) -> str:
    """The CSS background of `value` on a diverging map centred on 0 (scale: the largest |value|)."""
    if not np.isfinite(value) or scale <= 0:
        return "transparent"
    r, g, b = POSITIVE if value >= 0 else NEGATIVE
    return f"rgba({r}, {g}, {b}, {min(abs(value) / scale, 1.0):.3f})"


def token_line(tokens: Sequence[str], scores: Sequence[float], *, label: str = "", scale: float | None = None) -> str:
    """One line of tokens, each on its score's colour with the score as its tooltip (NaN: no colour)."""
    values = _numbers(scores, "scores").reshape(-1)
    if len(values) != len(tokens):
        raise ConfigError(f"{len(tokens)} tokens but {len(values)} scores; give one score per token.")
    finite = np.abs(values[np.isfinite(values)])
    scale = float(finite.max()) if scale is None and len(finite) else float(scale or 0.0)
    spans = "".join(
        f'<span style="background: {colour(v, scale)}; padding: 1px 2px; margin: 0 1px; border-radius: 2px; '
        f'white-space: pre" title="{escape(f"{i}: {v:.4g}")}">{escape(t)}</span>'
        for i, (t, v) in enumerate(zip(tokens, values)))
    head = f'<b style="display: inline-block; min-width: 11em">{escape(label)}</b>' if label else ""
    return f"<div style='line-height: 1.9; font-family: monospace'>{head}{spans}</div>"


class HTMLView:
    """A fragment of HTML that notebooks display (`_repr_html_`); `.html` is the text."""

    def __init__(self, html: str, text: str) -> None:
        self.html, self._text = html, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self._text


def _token_strings(tokens: Any, model: Any) -> list[str]:
    if isinstance(tokens, str):
        raise ConfigError("tokens must be a list of token strings (model.to_str_tokens(...)) or token ids with model=.")
    if hasattr(tokens, "detach") or (isinstance(tokens, Sequence) and tokens and isinstance(tokens[0], (int, np.integer))):
        if model is None:
            raise ConfigError("token ids need model= to be shown as text; or pass model.to_str_tokens(ids).")
        return [str(t) for t in model.to_str_tokens(tokens)]
    return [str(t) for t in tokens]


def show_tokens(scores: Any, tokens: Any = None, *, model: Any = None, example: int | None = None,
                methods: Sequence[str] | None = None, label: str = "") -> HTMLView:
    """Scores drawn on their tokens, diverging colours centred on 0, every token shown.

    scores: one score per token (a tensor, array or list; tokens: their strings, or ids with model=),
    or an attribution Result: one line per method for one example (`example`, default the first)
    from its token_scores table, integrated gradients signed (methods: which lines)."""
    if hasattr(scores, "tables") and hasattr(scores, "name"):
        return _result_tokens(scores, example=example, methods=methods)
    if tokens is None:
        raise ConfigError("show_tokens(scores, tokens): give the tokens the scores are for (strings, or ids with model=).")
    strs = _token_strings(tokens, model)
    values = _numbers(scores, "scores").reshape(-1)
    html = token_line(strs, values, label=label)
    return HTMLView(f"<div class='headscope-tokens'>{html}</div>", f"TokenView({len(strs)} tokens)")


def _result_tokens(result: Any, *, example: int | None, methods: Sequence[str] | None) -> HTMLView:
    """One row per method over every token of one example, in one table so a token's scores share a column (review
    18e C2): the gradient methods' raw scores (token_scores; integrated gradients signed) on every token, then
    leave-one-out, last-layer attention and rollout as the shares the taus rank (the scores table: the first and the
    last token are not ranked, so blank there); each row coloured against its own largest |score|, shown at its end."""
    table = result.tables.get("token_scores")
    if table is None:
        raise ConfigError(f"show_tokens takes an attribution Result (its token_scores table), not a {result.name!r} one; "
                          f"for other scores pass them with their tokens: hs.show_tokens(scores, tokens).")
    examples = sorted(int(e) for e in table["example"].unique())
    example = examples[0] if example is None else example
    if example not in examples:
        raise ConfigError(f"example {example} is not in this result; choose one of {examples[:10]}.")
    one = table[table["example"] == example]
    ranked = result.tables.get("scores")
    ranked = ranked[(ranked["example"] == example) & ranked["method"].isin(RANKED_METHODS)] if ranked is not None else None
    present = list(dict.fromkeys(one["method"])) + ([m for m in RANKED_METHODS if m in set(ranked["method"])]
                                                    if ranked is not None else [])
    methods = [m for m in (*TOKEN_METHODS, *RANKED_METHODS) if m in present] + \
        [m for m in present if m not in TOKEN_METHODS + RANKED_METHODS] if methods is None else list(methods)
    from headscope.analyses.attribution.convergence import IG_METHOD, ig_use

    summary = getattr(result, "summary", None)
    unused = IG_METHOD if not ig_use(summary if isinstance(summary, dict) else {}).keeps(example) else None
    rounding = rounding_marks(summary if isinstance(summary, dict) else {}, result.tables, example)
    first = one[one["method"] == one["method"].iloc[0]].sort_values("position")
    positions, tokens = list(first["position"]), [str(t) for t in first["token"]]  # every token of the example
    rows = []
    for method in methods:
        part = (one[one["method"] == method] if method not in RANKED_METHODS or ranked is None
                else ranked[ranked["method"] == method])
        if part.empty:
            raise ConfigError(f"no scores by {method!r}; this result has {present}.")
        by = dict(zip(part["position"], part["score"]))
        values = np.array([by.get(p, np.nan) for p in positions], dtype=float)  # [pos]: NaN where not scored
        label = RANKED_LABELS.get(method, method) + (" *" if method == unused or method in rounding else "")
        rows.append(_score_row(tokens, values, label))
    notes = (["* integrated gradients missed completeness on this example: used in no claim."] if unused in methods
             else []) + [rounding[m] for m in methods if m in rounding]
    note = "".join(f"<div style='font: 11px sans-serif'>{escape(n)}</div>" for n in notes)
    html = (f"<table style='border-collapse: separate; border-spacing: 2px 3px; font-family: monospace'>{''.join(rows)}"
            f"</table>{note}{SCALE}")
    text = f"TokenView(example {example}: {', '.join(methods)})"
    return HTMLView("<div class='headscope-tokens'>" + html + "</div>", text)


ROUNDED = {"grad_x_input": ("gradient_rounding", "gradient x input"), "leave_one_out": ("loo_rounding", "leave-one-out")}


def rounding_marks(summary: dict, tables: dict, example: int) -> dict[str, str]:
    """Review 19v C1: the methods whose scores the analysis finds mostly within their rounding floor (the summary's
    gradient_rounding / loo_rounding ranks_rounding: the report leaves them out of its claims), each with its legend
    line: how many scores over all examples and on this one (the per-example table) are ties."""
    marks = {}
    for method, (key, words) in ROUNDED.items():
        entry = summary.get(key)
        if not isinstance(entry, dict) or not entry.get("ranks_rounding"):
            continue
        rows = tables.get(key)
        rows = rows[rows["example"] == example] if rows is not None and "example" in rows else None
        here = (f" (this example: {int(rows.n_within_floor.sum())} of {int(rows.n_scores.sum())})"
                if rows is not None and len(rows) else "")
        marks[method] = (f"* {words}: {entry.get('n_within')} of {entry.get('n_scores')} of its scores over all examples "
                         f"are within their {entry.get('dtype')} rounding floor{here} and count as ties, so its ranking "
                         "would rank rounding: used in no claim.")
    return marks


SCALE = ("<div style='font: 11px sans-serif'>Colour: red positive, blue negative, opacity |score| / the row's largest "
         "|score| (at its end); blank: not scored (the first and the last token are not ranked); hover for the value."
         "</div>")


def _score_row(tokens: Sequence[str], values: np.ndarray, label: str) -> str:
    """One table row: the label, each token on its score's colour (tooltip: position and score), the row's scale."""
    finite = np.abs(values[np.isfinite(values)])
    scale = float(finite.max()) if len(finite) else 0.0
    cells = "".join(
        f'<td style="background: {colour(v, scale)}; padding: 1px 2px; border-radius: 2px; white-space: pre" '
        f'title="{escape(f"{i}: {v:.4g}" if np.isfinite(v) else f"{i}: not scored")}">{escape(t)}</td>'
        for i, (t, v) in enumerate(zip(tokens, values)))
    return (f"<tr><th style='text-align: left; font-weight: bold; white-space: nowrap; padding-right: 1em'>"
            f"{escape(label)}</th>{cells}<td style='font: 11px sans-serif; padding-left: 1em; white-space: nowrap'>"
            f"max |score| {scale:.3g}</td></tr>")


def grid_html(values: Any, rows: Sequence[str], columns: Sequence[str], *, title: str = "") -> str:
    """A small table of values [row, column] on the diverging colours (centred on 0, scaled to the
    largest |value|), each cell showing its value; labels escaped."""
    grid = _numbers(values, "values")
    finite = np.abs(grid[np.isfinite(grid)])
    scale = float(finite.max()) if len(finite) else 0.0
    head = "".join(f"<th style='font-weight: normal'>{escape(c)}</th>" for c in columns)
    body = "".join(
        f"<tr><th style='font-weight: normal; text-align: right'>{escape(r)}</th>" + "".join(
            f"<td style='background: {colour(float(v), scale)}; padding: 1px 4px; text-align: right'>"
            f"{'' if not np.isfinite(v) else f'{v:.3g}'}</td>" for v in line) + "</tr>"
        for r, line in zip(rows, grid))
    caption = f"<caption style='text-align: left'><b>{escape(title)}</b></caption>" if title else ""
    return (f"<table style='border-collapse: collapse; font: 11px monospace; margin: 0 1em 1em 0; display: inline-table'>"
            f"{caption}<tr><th></th>{head}</tr>{body}</table>")


def one_example_grids(result: Any, limit: int = 4) -> str:
    """The [layer, head] or [layer, pos] grids of a one-example Result's main table (heads: importance
    per method; patching: effect per site type), as HTML; "" for other Results."""
    df, out = result.df, []
    if result.name == "heads" and {"method", "importance"} <= set(df.columns):
        for method in list(dict.fromkeys(df["method"]))[:limit]:
            grid = result.tensor("importance", method=method).numpy()  # [layer, head]
            out.append(grid_html(grid, [f"L{l}" for l in range(grid.shape[0])], [f"H{h}" for h in range(grid.shape[1])],
                                 title=f"importance ({method})"))
    elif result.name == "patching" and {"site_type", "effect"} <= set(df.columns):
        for kind in list(dict.fromkeys(df["site_type"]))[:limit]:
            part = df[df["site_type"] == kind]
            grid = result.tensor("effect", site_type=kind).numpy()
            if grid.ndim != 2:
                continue
            columns = ([str(t) for t in part.drop_duplicates("pos").sort_values("pos")["token"]]
                       if part["head"].isna().all() else [f"H{h}" for h in range(grid.shape[1])])
            out.append(grid_html(grid, [f"L{l}" for l in range(grid.shape[0])], columns, title=f"effect ({kind})"))
    return "".join(out)


_INVISIBLE = re.compile("[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")


def _invisible(match: re.Match) -> str:
    """A control or zero-width character as its escape, in glyphs every font has: a carriage return "\\r", any other
    below U+0100 "\\xNN" (NUL "\\x00", DEL "\\x7f"), above it "\\uNNNN" (a zero-width space "\\u200b")."""
    code = ord(match.group())
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible_token(token: Any) -> str:
    """A token as a label that shows its whitespace: each space as "␣", a newline as "↵", a tab as "⇥" (review 10a
    B2: a byte-level BPE's " Sever" must read apart from the word piece "al", and a token that is only a space
    must not be a blank label), any other control or zero-width character as its escape (a carriage
    return "\\r", a zero-width space "\\u200b": review 20, they were blank labels). The explorer's script
    (explorer.js `visible`) and the figures' token ticks (plots.token_label) show tokens the same way."""
    text = str(token).replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    return _INVISIBLE.sub(_invisible, text)


# ---- attention patterns of chosen heads --------------------------------------------------------------
def pattern_view(pattern: Any, tokens: Sequence[str], *, labels: Sequence[str] | None = None, title: str = "",
                 window: int | None = None, layer: int | None = None, positions: Sequence[int] | None = None,
                 n_total: int | None = None, sinks: bool | None = None) -> HTMLView:
    """Attention patterns [head, query, key] (CircuitsVis's shape; [query, key] is one head) over string
    tokens: one grid per head, rows the queries, columns the keys, each cell's colour its weight on the
    explorer's sequential scale (white 0 to dark red 1, its colour bar above the grids) and its tooltip the
    value (query token -> key token); a token's spaces show as "␣" (visible_token). window: the layer's
    sliding window (models.layer_windows), `layer` its index: keys outside it (visible_keys) are hatched as
    masked, not drawn as zero attention, and the explorer's sentence says the window (review 14c C2). positions: each
    token's place in a prompt of n_total tokens that was cut (attention_capture.kept_positions), which the masking
    reads and the title says. sinks: whether the model has learned attention sinks (its rows sum to less than 1);
    None: judged from the rows' sums, beyond the pattern dtype's rounding. The explorer's stylesheet (scoped to .hsx)
    styles it; no script."""
    import torch

    from headscope.models.hooked_model import visible_keys
    from headscope.reports.explorer_view import CSS, MASKED, SCALE_NOTE, SINKS_SCALE_NOTE, seq, window_words

    dtype = getattr(pattern, "dtype", None)  # a half-precision pattern's rows miss 1 by its rounding (0.998 in bf16)
    slack = max(1e-3, 2 * torch.finfo(dtype).eps) if isinstance(dtype, torch.dtype) and dtype.is_floating_point else 1e-3
    values = _numbers(pattern, "pattern")
    values = values[None] if values.ndim == 2 else values
    tokens = [visible_token(t) for t in tokens]  # labels and tooltips show spaces as "␣"
    n = len(tokens)
    if values.ndim != 3 or values.shape[1:] != (n, n):
        raise ConfigError(f"pattern must be [head, query, key] (or [query, key]) over the {n} tokens, "
                          f"got shape {tuple(values.shape)}.")
    labels = [f"head {h}" for h in range(values.shape[0])] if labels is None else [str(x) for x in labels]
    if len(labels) != values.shape[0]:
        raise ConfigError(f"{len(labels)} labels for {values.shape[0]} heads.")
    pos = np.arange(n) if positions is None else np.asarray(list(positions))
    causal = pos[None, :] <= pos[:, None]  # [q, k]
    masked = causal & ~visible_keys(pos[:, None], pos[None, :], window).numpy() if window else np.zeros((n, n), bool)
    cell = "width: 1.4em; height: 1.4em; padding: 0; border: 1px solid #eee"
    keys = "".join(f"<th style='writing-mode: vertical-rl; font-weight: normal'>{escape(t)}</th>" for t in tokens)
    grids = []
    for label, grid in zip(labels, values):
        rows = []
        for q in range(n):
            cells = "".join(
                f"<td class='hsx-masked' style='{cell}' title='{escape(f'{tokens[q]} -> {tokens[k]}: {MASKED}')}'></td>"
                if masked[q, k] else
                f"<td style='{cell}; background: {seq(float(grid[q, k]))}' "
                f"title='{escape(f'{tokens[q]} -> {tokens[k]}: {grid[q, k]:.4f}')}'></td>" for k in range(n))
            rows.append(f"<tr><th style='text-align: right; font-weight: normal'>{escape(tokens[q])}</th>{cells}</tr>")
        grids.append(f"<div style='display: inline-block; margin: 0 1em 1em 0; vertical-align: top'><b>{escape(label)}"
                     f"</b><table class='hsx-heat' style='border-collapse: collapse; font: 11px monospace'><tr><th></th>"
                     f"{keys}</tr>{''.join(rows)}</table></div>")
    cut = "" if positions is None or n_total is None or n >= n_total else (
        f"; {n} of {n_total} tokens: the first and the last {n - 1}, positions {pos[0] + 1}–{pos[1] - 1} cut, a "
        "query's weights on them not drawn")
    head = f"<p><b>{escape(title)}</b> (rows: queries, columns: keys{escape(cut)})</p>" if title else ""
    said = window_words({0 if layer is None else int(layer): int(window)}) if window else ""
    if said and layer is None:
        said = said.replace("layer 0 attends", "this layer attends", 1)
    line = f"<div class='hsx-windowline'>{escape(said)}</div>" if said else ""
    ramp = f"linear-gradient(90deg,{seq(0)},{seq(1)})"
    # review 19b A2: rows of a whole prompt summing to less than 1 are a learned sink's (GPT-OSS): say so, not "1"
    short = bool(sinks) if sinks is not None else positions is None and bool((values.sum(-1) < 1 - slack).any())
    scale = (f"<div class='hsx-scale'><span>attention weight:</span><span>0</span><span class='hsx-ramp' "
             f"style='display: inline-block; width: 140px; height: 10px; background: {ramp}'></span><span>1</span>"
             f"<span class='hsx-note'>{escape(SINKS_SCALE_NOTE if short else SCALE_NOTE)}</span></div>")
    return HTMLView(f"<div class='hsx headscope-patterns'><style>{CSS}</style>{head}{line}{scale}{''.join(grids)}</div>",
                    f"PatternView({values.shape[0]} head(s), {n} tokens)")


__all__ = ["HTMLView", "colour", "grid_html", "one_example_grids", "pattern_view", "show_tokens", "token_line"]
