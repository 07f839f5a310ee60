"""HTML and Markdown rendering of results: notebook cells and the report's sections.

Every string that comes from a model, a tokenizer, a prompt or a user goes through `escape`;
figures are inlined as base64 PNG so that nothing is fetched from anywhere.
"""
from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

MAX_ROWS = 20


def figure_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", pad_inches=0.2, metadata={"Software": None})
    return buf.getvalue()


def img_tag(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}" style="max-width:100%">'


def table_html(df: pd.DataFrame, max_rows: int = MAX_ROWS, where: str = "the CSV") -> str:
    """An escaped HTML table of the first rows (pandas escapes cell text with escape=True); `where`
    the rest are (the report's CSV file; a notebook's result.df)."""
    shown = df.head(max_rows)
    more = f"<p><em>{len(df) - max_rows} more rows in {escape(where)}.</em></p>" if len(df) > max_rows else ""
    return shown.to_html(index=False, escape=True, border=0, classes="table", float_format=lambda x: f"{x:.4g}") + more


def summary_html(summary: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(_short(v))}</td></tr>" for k, v in summary.items())
    return f'<table class="summary">{rows}</table>'


def _short(value: Any, limit: int = 160) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def n_examples(result: Any) -> int | None:
    """How many examples a Result covers (its summary's n_examples, else its table's examples)."""
    n = result.summary.get("n_examples") if isinstance(result.summary, Mapping) else None
    if isinstance(n, int):
        return n
    return int(result.df["example"].nunique()) if "example" in getattr(result.df, "columns", ()) else None


def result_html(result: Any, with_figures: bool = True) -> str:
    """A notebook cell for a Result: its summary, its main table and its figures. A Result of one
    example gets a short view: the summary's plain numbers, ten rows, and its tokens (attribution,
    show_tokens) or its [layer, head] / [layer, pos] grids (heads, patching), no figures."""
    from headscope.reports.findings import finding

    one = n_examples(result) == 1
    text = finding(result.name, result.summary)
    summary = result.summary
    if one:
        summary = {k: v for k, v in result.summary.items() if not isinstance(v, (Mapping, list, tuple))}
    left = len(result.summary) - len(summary)
    source = getattr(result, "source", None)
    ran = [f"{k} {escape(str(v))}" for k in ("model", "task") if source and (v := source(k)) is not None]
    dtype = source("dtype") if source else None  # review 14c C4: the precision, where the model is named
    if ran and ran[0].startswith("model ") and isinstance(dtype, str):
        ran[0] += f", run in {escape(dtype)}"
    parts = [f"<h3>{escape(result.name)}</h3>", f"<p class='source'>{'; '.join(ran)}</p>" if ran else "",
             f"<p class='finding'>{escape(text)}</p>" if text else "",
             summary_html(summary), f"<p><em>{left} more entries in result.summary.</em></p>" if left else "",
             *_constant_notes(result.df), table_html(_without_constant_notes(result.df), 10 if one else MAX_ROWS,
                                                     where="result.df")]
    if one:  # tokens or grids in HTML, no figures over examples
        from headscope.reports.tokens_view import one_example_grids, show_tokens

        parts.append(show_tokens(result).html if "token_scores" in result.tables else one_example_grids(result))
        parts.append("<p><em>result.plot() draws the figures.</em></p>")
    elif with_figures:
        import matplotlib.pyplot as plt

        for stem, fig in result.plot().items():
            parts.append(img_tag(figure_png(fig), stem))
            plt.close(fig)
    return "<div class='headscope-result'>" + "".join(parts) + "</div>"


def _note_columns(df: pd.DataFrame) -> list[str]:
    """The '*_note' columns of df that hold one text on every row (patching's share_note)."""
    return [c for c in df.columns if str(c).endswith("_note") and len(df) and df[c].nunique(dropna=False) == 1
            and isinstance(df[c].iloc[0], str)]


def _constant_notes(df: pd.DataFrame) -> list[str]:
    """Review 15b C4: a note that is the same on every row, said once above the table (not on every row of it)."""
    return [f"<p class='note'><em>{escape(c)} (every row of result.df): {escape(df[c].iloc[0])}</em></p>"
            for c in _note_columns(df)]


def _without_constant_notes(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=_note_columns(df))


def summary_markdown(summary: Mapping[str, Any]) -> str:
    lines = ["| key | value |", "|---|---|"]
    lines += [f"| {md_escape(k)} | {md_escape(_short(v))} |" for k, v in summary.items()]
    return "\n".join(lines)


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_{}[]()#+!|~"})


_MD_TAG = re.compile(r"<(?=[A-Za-z/!?])")  # a '<' that would open a tag, a comment or an autolink
_MD_ENTITY = re.compile(r"&(?=#?\w+;)")  # an '&' that would start an entity reference ("&lt;" shown as "<")


def md_escape(text: Any) -> str:
    """Text safe in Markdown and readable as text (review 16a C3: "the block&#x27;s input", "p &lt; 0.001" in
    report.md): Markdown's punctuation backslash-escaped (no links, images, emphasis or table cells from user
    strings), a '<' that would open a tag (or autolink, comment) and an '&' that would start an entity reference
    written as entities, a leading '>' (a block quote) backslash-escaped; every other character as it is ("it's",
    "p < 0.001", "->"); newlines become spaces."""
    out = _MD_ENTITY.sub("&amp;", " ".join(str(text).split()).translate(_MD_SPECIAL))
    out = _MD_TAG.sub("&lt;", out)
    return "\\" + out if out.startswith(">") else out


def escape(text: Any) -> str:
    """HTML-escape anything shown in a report or notebook (token strings may hold <script>)."""
    return html.escape(str(text), quote=True)
