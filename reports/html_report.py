"""report.html and report.md, assembled from an output folder's files.

Self-contained: CSS inline, figures inlined as base64 PNG, no external URLs; the one script is
the attention explorer's (reports/explorer_view.py), drawn from OUT/explorer.json when a run wrote it.
Every string read from the results (token strings, prompts, model names) is escaped.
"""
from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from headscope.reports import io
from headscope.reports.explorer_view import explorer_html
from headscope.reports.guides import GUIDES
from headscope.reports.render import escape, summary_html, summary_markdown, table_html

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left}
.summary th{background:#f6f6f6}.failed{color:#a00}.guide{color:#444;font-style:italic}
img{display:block;margin:1em 0}
"""


def _headline(summary: Mapping[str, Any], n: int = 4) -> str:
    scalars = [(k, v) for k, v in summary.items() if isinstance(v, (int, float, str, bool)) and not isinstance(v, bool)]
    return "; ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}" for k, v in scalars[:n])


def _section(out: Path, name: str, status: str) -> tuple[str, str, str]:
    """(html section, markdown section, headline) for one analysis."""
    folder = out / name
    head = f'<h2 id="{escape(name)}">{escape(name)}</h2><p class="guide">{escape(GUIDES.get(name, ""))}</p>'
    if not (folder / "summary.json").exists():
        msg = escape(status or "not run")
        return head + f'<p class="failed">{msg}</p>', f"## {name}\n\n{status or 'not run'}\n", status
    summary = io.read_json(folder / "summary.json")
    parts = [head, summary_html(summary)]
    md = [f"## {name}", "", GUIDES.get(name, ""), "", summary_markdown(summary), ""]
    for png in sorted(folder.glob("*.png")):
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(f'<img alt="{escape(png.stem)}" src="data:image/png;base64,{data}" style="max-width:100%">')
        md.append(f"![{png.stem}]({name}/{png.name})")
    for csv in sorted(folder.glob("*.csv")):
        parts.append(f"<h3>{escape(csv.stem)}</h3>" + table_html(pd.read_csv(csv)))
        md.append(f"- [{csv.name}]({name}/{csv.name})")
    return "".join(parts), "\n".join(md) + "\n", _headline(summary)


EXPLORER_FILE = "explorer.json"  # written by reports.explorer.write_explorer_data during the run


def _explorer_section(out: Path) -> tuple[str, str]:
    """(html, markdown) of the attention explorer from OUT/explorer.json; empty when absent or unreadable."""
    path = out / EXPLORER_FILE
    if not path.exists():
        return "", ""
    try:
        data = io.read_json(path)
        fragment = explorer_html(data, uid="hsx-report")
    except (OSError, ValueError, KeyError, TypeError):
        return "", ""
    n = len(data.get("examples", []))
    html = ("<h2 id='explorer'>attention explorer</h2><p class='guide'>Every head's attention pattern on "
            f"{n} example(s) of the task; the grid is coloured by the chosen per-head score.</p>" + fragment)
    return html, f"## attention explorer\n\n- [{EXPLORER_FILE}]({EXPLORER_FILE}) (interactive in report.html)\n"


def write_report_files(out: Path, names: Sequence[str], status: Mapping[str, str], model: Mapping[str, Any]) -> None:
    sections, md_sections, rows = [], [], []
    for name in names:
        html_part, md_part, headline = _section(out, name, status.get(name, ""))
        sections.append(html_part)
        md_sections.append(md_part)
        rows.append(f'<tr><td><a href="#{escape(name)}">{escape(name)}</a></td>'
                    f'<td>{escape(status.get(name, ""))}</td><td>{escape(headline)}</td></tr>')
    explorer, explorer_md = _explorer_section(out)
    if explorer:
        sections.insert(0, explorer)
        md_sections.insert(0, explorer_md)
    task_csv = out / "task_examples.csv"
    if task_csv.exists():
        examples = pd.read_csv(task_csv, dtype=str, keep_default_na=False)
        sections.insert(0, "<h2 id='task'>task</h2><p>The examples of the task file (first rows).</p>" + table_html(examples))
        md_sections.insert(0, "## task\n\n- [task_examples.csv](task_examples.csv)\n")
    title = f"headscope report: {model.get('name', '')}"
    facts = (f"{model.get('family', '')}, {model.get('n_layers', '?')} layers x {model.get('n_heads', '?')} heads, "
             f"d_model {model.get('d_model', '?')}")
    html = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1><p>{escape(facts)}. Data: the CSV and JSON files beside this report; "
        "provenance: manifest.json.</p>"
        "<h2>Summary</h2><table><tr><th>analysis</th><th>status</th><th>headline</th></tr>"
        + "".join(rows) + "</table>" + "".join(sections) + "</body></html>"
    )
    md = f"# {title}\n\n{facts}\n\n" + "\n".join(md_sections)
    io.write_text(out / "report.md", md)
    io.write_text(out / "report.html", html)
