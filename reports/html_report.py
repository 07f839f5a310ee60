"""report.html and report.md, assembled from an output folder's files.

Self-contained: CSS inline, figures inlined as base64 PNG, no external URLs; the one script is
the attention explorer's (reports/explorer_view.py), drawn from OUT/explorer.json when a run wrote it.
Every string read from the results (token strings, prompts, model names) is escaped.
"""
from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from headscope.models import particulars
from headscope.models.attention_layout import attention_words
from headscope.models.config_facts import header_words
from headscope.models.hooked_model import window_words
from headscope.reports import io
from headscope.reports.explorer_view import (
    caveat_scores,
    explorer_html,
    link_heads,
    muted_scores,
    rounding_floors,
    section_links,
    undetermined_caveat,
)
from headscope.reports.findings import attention_kind, caption, finding, larger_sample_sentence
from headscope.reports.moe_words import layout_clause
from headscope.reports.provenance import (
    TASK_FILE,
    below_quick_line,
    bos_sentence,
    budget_line,
    manifest_speeds,
    provenance_html,
    provenance_markdown,
    section_provenance,
    subset_sentence,
    with_code,
)
from headscope.reports.render import escape, figure_png, md_escape, summary_html, summary_markdown, table_html

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left}
.summary th{background:#f6f6f6}.failed{color:#a00}.guide{color:#444;font-style:italic}
img{display:block;margin:1em 0}
.skipped{color:#666}.task-used{color:#444}
.finding{background:#f4f8fc;border-left:4px solid #4a7fb5;padding:.5em .8em;margin:.6em 0}
nav.toc ol{columns:3;font-size:.9em}nav.toc a{text-decoration:none}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:1em}
.figs figure{margin:0;border:1px solid #eee;padding:.4em}.figs figure.wide{grid-column:1/-1}
.figs img{max-width:100%;margin:0 auto}
figcaption{font-size:.85em;color:#444}details{margin:.3em 0}summary{cursor:pointer;color:#235}
.provenance{font-size:.85em;color:#444;border-top:1px solid #ddd;margin-top:3em}
.scroll{max-height:28em;overflow:auto;border:1px solid #eee}.scroll thead th{position:sticky;top:0;background:#f6f6f6}
"""
HTML_ROWS = 100  # rows of each CSV inline (scrollable past about 20); the whole table is the linked CSV


def _guide(name: str, summary: Mapping[str, Any] | None = None) -> str:
    """How to read analysis `name`'s section (its presentation's guide, the run's own where it has guide_for and a
    summary; "" for an unknown folder)."""
    from headscope.reports.families import presentation

    shown = presentation(name)
    if shown is None:
        return ""
    return shown.guide_for(summary) if shown.guide_for is not None and summary is not None else shown.guide


def _headline(summary: Mapping[str, Any], n: int = 4) -> str:
    scalars = [(k, v) for k, v in summary.items() if isinstance(v, (int, float, str, bool)) and not isinstance(v, bool)]
    return "; ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}" for k, v in scalars[:n])


def _finding_html(text: str) -> str:
    return f'<p class="finding">{escape(text)}</p>' if text else ""


def _png_width(path: Path) -> int:
    """Pixel width from the PNG header (0 when it is not a PNG)."""
    head = path.read_bytes()[:24]
    return int.from_bytes(head[16:20], "big") if head[:8] == b"\x89PNG\r\n\x1a\n" else 0


def _figures_html(folder: Path, summary: Mapping[str, Any] | None = None) -> str:
    """The analysis's figures in a grid, each with its caption (what to read, units; the summary's own where the
    units follow the run, findings.caption)."""
    cells = []
    for png in sorted(folder.glob("*.png")):
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        text = caption(png.stem, summary)
        wide = ' class="wide"' if _png_width(png) > 1000 else ""  # a multi-panel figure takes the whole row
        alt = f"{png.stem}: {text}" if text else png.stem  # what the figure shows, not only its file name
        cells.append(f'<figure{wide}><img alt="{escape(alt)}" src="data:image/png;base64,{data}">'
                     f"<figcaption><b>{escape(png.stem)}</b>{': ' + escape(text) if text else ''}</figcaption></figure>")
    return f'<div class="figs">{"".join(cells)}</div>' if cells else ""


def _tables_html(folder: Path, summary: Mapping[str, Any]) -> str:
    """The summary and every CSV's first HTML_ROWS rows in a scrollable box, each collapsed in a
    <details> with a link to the CSV file (an empty CSV says so)."""
    parts = [f"<details><summary>summary.json ({len(summary)} keys)</summary>{summary_html(summary)}</details>"]
    for csv in sorted(folder.glob("*.csv")):
        href = escape(f"{folder.name}/{csv.name}")
        try:
            df = pd.read_csv(csv)
            body, size = f'<div class="scroll">{table_html(df, max_rows=HTML_ROWS)}</div>', f"{len(df)} rows"
        except pd.errors.EmptyDataError:
            body, size = "<p><em>empty</em></p>", "empty"
        parts.append(f'<details><summary>{escape(csv.name)} ({size}) <a href="{href}">{escape(csv.name)}</a></summary>'
                     f"{body}</details>")
    return "".join(parts)


def _figures_markdown(folder: Path, name: str, summary: Mapping[str, Any] | None = None) -> list[str]:
    lines = []
    for png in sorted(folder.glob("*.png")):
        lines += [f"![{md_escape(png.stem)}]({name}/{png.name})", "", md_escape(caption(png.stem, summary)), ""]
    return lines


def _toc_html(entries: Sequence[tuple[str, str]]) -> str:
    """A table of contents: (anchor id, label) pairs."""
    items = "".join(f'<li><a href="#{escape(anchor)}">{escape(label)}</a></li>' for anchor, label in entries)
    return f'<nav class="toc"><h2>Contents</h2><ol>{items}</ol></nav>'


def _findings_html(names: Sequence[str], status: Mapping[str, str], texts: Mapping[str, str],
                   link: Callable[[str, str], str] = lambda html, name: html) -> str:
    """The findings, one paragraph per analysis; link(html, name) links the head names in its row."""
    rows = []
    for name in names:
        state = status.get(name, "")
        text = texts.get(name, "") or (state if state and state != "done" else "")
        if state.startswith("failed") and text == state:  # the failure is the text: said once, in red (review 15c C3)
            body = f": <span class='failed'>{escape(text)}</span>"
        else:
            body = ((f" <span class='failed'>({escape(state)})</span>" if state.startswith("failed") else "")
                    + f": {escape(text) or 'no headline.'}")
        rows.append(link(f'<p class="finding"><b><a href="#{escape(name)}">{escape(name)}</a></b>{body}</p>', name))
    return "<h2 id='findings'>Findings</h2>" + "".join(rows)


def _findings_markdown(names: Sequence[str], status: Mapping[str, str], texts: Mapping[str, str]) -> str:
    lines = ["## Findings", ""]
    for name in names:
        text = texts.get(name, "") or status.get(name, "")
        lines.append(f"- **{md_escape(name)}**: {md_escape(text)}")
    return "\n".join(lines) + "\n"


def _with_users(examples: pd.DataFrame, out: Path, names: Sequence[str],
                speeds: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The task table with a "used by" column: the analyses whose task.json lists the row among the rows
    they ran on (a table without file row numbers, written before they were recorded, is left as it is)."""
    if "row" not in examples.columns:
        return examples
    users: dict[str, list[str]] = {}
    for name in names:
        rows = section_provenance(out / name, speeds=speeds).get("rows")
        for r in rows if isinstance(rows, list) else ():
            users.setdefault(str(r), []).append(name)
    return examples.assign(**{"used by": [", ".join(users.get(r, [])) for r in examples["row"]]})


def _provenance(out: Path) -> dict[str, Any]:
    """Model, task, seed, versions, commit and command from OUT/manifest.json ({} when unreadable)."""
    try:
        manifest = io.read_json(out / "manifest.json")
    except (OSError, ValueError):
        return {}
    if not isinstance(manifest, dict):
        return {}
    config = manifest.get("config") or {}
    model = manifest.get("model") or {}
    versions = manifest.get("versions") or {}
    command = manifest.get("command")
    return {
        "model": model.get("name", ""), "source": model.get("source", ""), "task": tasks_line(out, config),
        "seed": manifest.get("seed", ""), "quick": config.get("quick", ""), "device": config.get("device", ""),
        "dtype": config.get("dtype") or "",
        **({"BOS": bos} if (bos := bos_sentence(config)) else {}),
        **({"budget": budget_line(manifest)} if "budget_minutes" in config else {}),
        "commit": manifest.get("git_sha") or "unknown",
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()) if isinstance(versions, dict) else str(versions),
        "command": " ".join(map(str, command)) if isinstance(command, list) else str(command or ""),
    }


def tasks_line(out: Path, config: Mapping[str, Any]) -> str:
    """The footer's task row (review 13c C1: "task: default" over sections that ran on four tasks): each task the
    sections ran on with its sections, from their task.json, in the run's order: "per section: kv (heads, attribution),
    ioi (patching); your task: x.jsonl" ("default" or the --task given where no section recorded one)."""
    given = config.get("task")
    names = config.get("analyses") or sorted(p.parent.name for p in out.glob(f"*/{TASK_FILE}"))
    by_task: dict[str, list[str]] = {}
    for name in names:
        try:
            task = io.read_json(out / str(name) / TASK_FILE).get("task")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(task, str) and task:
            by_task.setdefault(task, []).append(str(name))
    if not by_task:
        return str(given or "default")
    listed = ", ".join(f"{task} ({', '.join(users)})" for task, users in by_task.items())
    return f"per section: {listed}" + (f"; your task: {given}" if given else "")


def _provenance_html(info: Mapping[str, Any]) -> str:
    if not info:
        return "<div class='provenance' id='provenance'><h2>Provenance</h2><p>manifest.json not found.</p></div>"
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{with_code(v, markdown=False) if k == 'BOS' else escape(v)}</td></tr>"
                   for k, v in info.items())
    return f"<div class='provenance' id='provenance'><h2>Provenance</h2><table class='summary'>{rows}</table></div>"


def _provenance_markdown(info: Mapping[str, Any]) -> str:
    lines = ["## Provenance", ""] + [f"- {k}: {with_code(v, markdown=True) if k == 'BOS' else md_escape(v)}"
                                     for k, v in info.items()]
    return "\n".join(lines) + "\n"


def _section(out: Path, name: str, status: str, used: str = "",
             speeds: Mapping[str, Any] | None = None) -> tuple[str, str, str]:
    """(html section, markdown section, headline) for one analysis; `used`: the data it ran on
    (the manifest's task_used). A skipped analysis shows its reason, not as a failure."""
    folder = out / name
    head = f'<h2 id="{escape(name)}">{escape(name)}</h2><p class="guide">{escape(_guide(name))}</p>'
    if not (folder / "summary.json").exists():
        if used:
            head += f'<p class="task-used">data: {escape(used)}</p>'
        kind = "skipped" if status.startswith("skipped") else "failed"
        msg = escape(status or "not run")
        return head + f'<p class="{kind}">{msg}</p>', f"## {name}\n\n{md_escape(status or 'not run')}\n", status
    summary = io.read_json(folder / "summary.json")
    head = f'<h2 id="{escape(name)}">{escape(name)}</h2><p class="guide">{escape(_guide(name, summary))}</p>'
    text = finding(name, summary)
    if isinstance(summary.get("chance"), Mapping) and summary["chance"].get("undetermined") is True:
        others = {p.parent.name: io.read_json(p) for p in sorted(out.glob("*/summary.json")) if p.parent.name != name}
        larger = larger_sample_sentence(summary["chance"], others)  # the same run's larger sample (review 13b A2)
        text = text.replace("read with that caveat.", f"read with that caveat. {larger}", 1) if larger else text
    subset = subset_sentence(used)  # the user's one-token rows only: the finding says so first
    text = f"{subset} {text}" if subset and text else subset or text
    # task, source, n, one sample prompt, what the budget changed (speeds: the run's manifest, read once)
    record = section_provenance(folder, used, speeds)
    parts = [head, provenance_html(record), _finding_html(text), _figures_html(folder, summary),
             _tables_html(folder, summary)]
    md = [f"## {name}", "", _guide(name, summary), "", provenance_markdown(record),
          md_escape(text), "", summary_markdown(summary), ""]
    md += _figures_markdown(folder, name, summary)
    md += [f"- [{csv.name}]({name}/{csv.name})" for csv in sorted(folder.glob("*.csv"))]
    return "".join(parts), "\n".join(md) + "\n", text


EXPLORER_FILE = "explorer.json"  # written by reports.explorer.write_explorer_data during the run


def _explorer_section(out: Path) -> tuple[str, str]:
    """(html, markdown) of the attention explorer from OUT/explorer.json; empty when absent or unreadable."""
    path = out / EXPLORER_FILE
    if not path.exists():
        return "", ""
    try:
        data = io.read_json(path)
        heads = out / "heads" / "summary.json"  # importance at chance or under the noise floor: a muted grid
        heads_summary = io.read_json(heads) if heads.exists() else None
        data["muted"] = muted_scores(data.get("scores", {}), heads_summary)
        data["floors"] = rounding_floors(data.get("scores", {}), heads_summary)  # cells within it: grey, "≈0"
        # a section whose chance guard cannot tell (undetermined): its scores carry the finding's caveat
        data["caveats"] = caveat_scores(data.get("scores", {}), heads_summary)
        attribution = out / "attribution" / "summary.json"
        if attribution.exists() and (said := undetermined_caveat(io.read_json(attribution), "attribution", "these scores")):
            data["attribution_caveat"] = said
        fragment = explorer_html(data, uid="hsx-report")
    except (OSError, ValueError, KeyError, TypeError):
        return "", ""
    n = len(data.get("examples", []))
    n_tasks = len({e.get("task") for e in data.get("examples", [])})
    html = ("<h2 id='explorer'>attention explorer</h2><p class='guide'>Every head's attention pattern on "
            f"{n} example(s) of {'the task' if n_tasks < 2 else f'the {n_tasks} tasks the analyses used'}; "
            "the grid is coloured by the chosen per-head score."
            + (" Each task starts with the sample prompt its sections show; a head named in a finding links here, "
               "to that head on its section's prompt." if section_links(data) else "") + "</p>" + fragment)
    return html, f"## attention explorer\n\n- [{EXPLORER_FILE}]({EXPLORER_FILE}) (interactive in report.html)\n"


def _head_linker(out: Path) -> Callable[[str, str], str] | None:
    """link(html, section): the head names in a section's text linked to the explorer of OUT/explorer.json
    (explorer_view.link_heads), opening on that section's sample prompt where the explorer holds it;
    None when the file is unreadable."""
    try:
        data = io.read_json(out / EXPLORER_FILE)
        dims, shown = (int(data["n_layers"]), int(data["n_heads"])), section_links(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return lambda html, section: link_heads(html, *dims, section if section in shown else None)


def _top_heads_html(out: Path) -> str:
    """The top heads' attention patterns on the first explorer example, as an inline figure ("" without data)."""
    try:
        import matplotlib.pyplot as plt

        from headscope.reports.plots import quiet_reason
        from headscope.reports.plots_attention import heads_facts, top_heads_figure

        try:  # the heads analysis at chance: its importance ranks noise (plots_attention chooses otherwise)
            heads = io.read_json(out / "heads" / "summary.json")
        except (OSError, ValueError):
            heads = None
        fig = top_heads_figure(io.read_json(out / EXPLORER_FILE), quiet=quiet_reason(heads if isinstance(heads, dict) else None),
                               facts=heads_facts(out))  # review 18w C1: its intervals and ties
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return ""
    if fig is None:
        return ""
    png = figure_png(fig)
    plt.close(fig)
    data = base64.b64encode(png).decode("ascii")
    alt = escape("top_attention: " + caption("top_attention"))
    return (f'<figure><img alt="{alt}" src="data:image/png;base64,{data}" style="max-width:100%">'
            f"<figcaption><b>top_attention</b>: {escape(caption('top_attention'))}</figcaption></figure>")


def readout_clause(model: dict) -> str:
    """', post-LN blocks (...)' and ', token embeddings 64 wide, ...' from the manifest's facts (post_ln, d_embed); ''
    on other models. Both decide what the lens, DLA, gradient x input and a layer's probe read (review 16d B3)."""
    out = ""
    if model.get("post_ln"):
        out += (", post-LN blocks (each block's LayerNorms normalise the whole residual stream after its adds; "
                "no final norm)")
    if isinstance(model.get("d_embed"), int):
        d, e = model.get("d_model", "?"), model["d_embed"]
        out += (f", token embeddings {e} wide, projected into the {d}-wide stream (project_in) and back to {e} "
                f"before the unembedding (project_out)")
    return out


def positions_clause(model: Mapping[str, Any]) -> str:
    """', ALiBi positions (...)' from the manifest's facts (positional "alibi": BLOOM, MPT), else '': no position
    embedding, each head's fixed slope biases its scores by distance, which the heads' roles and the sink baselines
    read; 'no fixed context' where the config names no maximum length (BLOOM), else that length (review 19a A3: MPT's
    max_seq_len, beyond which the model, and headscope, refuse a prompt)."""
    if model.get("positional") != "alibi":
        return ""
    limit = model.get("n_ctx") if model.get("fixed_context") is not False else None
    context = (f"prompts of at most {limit} tokens (the config's maximum length)"
               if isinstance(limit, int) and not isinstance(limit, bool) else "no fixed context")
    return (", ALiBi positions (no position embedding: each head adds -slope x distance to its attention scores, "
            f"its slope fixed; {context})")


def _kv_clause(model: Mapping[str, Any]) -> str:
    """' (1 KV head: multi-query attention)' / ' (2 KV heads: grouped-query attention)' where the model has fewer KV
    heads than query heads (review 9b C2: k/v patching and the kv section count KV heads), else ''."""
    heads, kv = model.get("n_heads"), model.get("n_kv_heads")
    kind = attention_kind(heads, kv) if isinstance(heads, int) and isinstance(kv, int) else None
    if kind is None:
        return ""
    return f" (1 KV head: {kind} attention)" if kv == 1 else f" ({kv} KV heads: {kind} attention)"


def scalings_clause(model: Mapping[str, Any], ran: Sequence[str] | None = None) -> str:
    """The model's own scalings where they are not 1 (review 15a C3: Granite's multipliers), e.g. "scalings:
    embedding x12, residual writes x0.22, attention scores x0.0078125 (not 1/sqrt(d_head)), logits x0.125 (1/8)
    (the circuits and mlp numbers include them)", else ''. ran: the analyses that produced results; the clause names
    only those of circuits and mlp (review 16a C2: "the circuits ... numbers" on a report whose circuits failed)."""
    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None

    parts = [f"{what} x{value:.6g}" for what, key in (("embedding", "embed_scale"), ("residual writes", "residual_scale"))
             if (value := num(model.get(key))) is not None and value != 1.0]
    attention, d_head = num(model.get("attention_scale")), num(model.get("d_head"))
    d_qk = num((model.get("mla") or {}).get("d_head_qk"))  # MLA: scores over q/k heads wider than d_head (v's)
    if attention is not None and (d_qk or d_head) and abs(attention - (d_qk or d_head) ** -0.5) > 1e-12:
        parts.append(f"attention scores x{attention:.6g} (not 1/sqrt({d_qk:g}), the q/k head width)" if d_qk
                     else f"attention scores x{attention:.6g} (not 1/sqrt(d_head))")
    logit = num(model.get("logit_scale"))
    if logit is not None and logit != 1.0:
        parts.append(f"logits x{logit:.6g}" + (f" (1/{1 / logit:.6g})" if logit < 1 else ""))
    if not parts:
        return ""
    which = [n for n in ("circuits", "mlp") if ran is None or n in ran]
    return f", scalings: {', '.join(parts)}" + (f" (the {' and '.join(which)} numbers include them)" if which else "")


def write_report_files(out: Path, names: Sequence[str], status: Mapping[str, str], model: Mapping[str, Any],
                       task_used: Mapping[str, str] | None = None) -> None:
    """report.html and report.md; task_used: per analysis, the data it ran on (shown in its section)."""
    sections, md_sections, texts = [], [], {}
    toc = [("findings", "Findings")]
    speeds = manifest_speeds(out)  # each section's timed pass, read once for every section's provenance
    for name in names:
        html_part, md_part, texts[name] = _section(out, name, status.get(name, ""), (task_used or {}).get(name, ""),
                                                   speeds)
        sections.append(html_part)
        md_sections.append(md_part)
    explorer, explorer_md = _explorer_section(out)
    link = _head_linker(out) if explorer else None
    if link:  # head names in the findings link to that head in the explorer (#L1H3@patching: on patching's prompt)
        sections = [re.sub(r'<p class="finding">.*?</p>', lambda m, name=name: link(m[0], name), part, flags=re.S)
                    for name, part in zip(names, sections)]
    if explorer:
        sections.insert(0, explorer + _top_heads_html(out))
        md_sections.insert(0, explorer_md)
        toc.append(("explorer", "attention explorer"))
    task_csv = out / "task_examples.csv"
    if task_csv.exists():
        examples = _with_users(pd.read_csv(task_csv, dtype=str, keep_default_na=False), out, names, speeds)
        sections.insert(0, "<h2 id='task'>task</h2><details open><summary>The examples of the task file "
                        "(a seeded sample of up to 200 rows, in file order; row: the file's row, 0-based; used by: "
                        "the analyses that ran on it)</summary>" + table_html(examples) + "</details>")
        md_sections.insert(0, "## task\n\n- [task_examples.csv](task_examples.csv)\n")
        toc.insert(1, ("task", "task"))
    toc += [(name, name) for name in names] + [("provenance", "provenance")]
    info = _provenance(out)
    findings = _findings_html(names, status, texts, link) if link else _findings_html(names, status, texts)
    title = f"headscope report: {model.get('name', '')}"
    facts = (f"{model.get('family', '')}, {model.get('n_layers', '?')} layers x {model.get('n_heads', '?')} heads"
             f"{_kv_clause(model)}, "
             # review 17a C3: partial rotary and q/k norms change what "positional" and the kv norm sentences read
             + "".join(w + ", " for w in attention_words(model.get("rotary_dims"), model.get("d_head"), model.get("qk_norm"),
                                                  model.get("clip_qkv"), model.get("rotary_interleaved")))
             + f"d_model {model.get('d_model', '?')}")
    if isinstance(model.get("mla"), dict):  # review 15d C4: the per-head widths of multi-head latent attention
        from headscope.models.hooked_model import mla_words

        facts += ", " + mla_words(model["mla"])
    facts += positions_clause(model)  # ALiBi: a head's fixed slope sets part of where it looks
    facts += readout_clause(model)  # review 16d B3: post-LN blocks, a projected embedding
    experts = layout_clause(model.get("experts_per_layer"), model.get("n_layers"), model.get("d_mlp"))
    if experts:  # review 11c A3: which blocks are mixtures of experts, and the dense ones among them
        facts += f", {experts}"
    ran = [n for n in names if str(status.get(n, "")).startswith("done")]  # review 16a C2: the sections with numbers
    facts += scalings_clause(model, ran)  # review 15a C3: Granite's multipliers decide what the units mean
    facts += "".join(", " + w for w in header_words(model))  # review 18b C1: soft-caps, rotary bases by layer
    facts += "".join(", " + w for w in particulars.header_words({**model, "learned_sink_share": _learned_share(out)}))
    if words := window_words(model.get("attention_windows") or {}, model.get("n_layers")):  # review 17d C2
        facts += f", {words}"
    if model.get("tied_embeddings"):  # review 9b C2: the unembedding is the embedding (DLA and the lens read it)
        facts += ", tied embeddings"
    if model.get("parallel_blocks"):  # review 8 C2: mlpL reads the block's input, as layer L's heads do
        facts += ", parallel blocks (attention and MLP both read the block's input)"
    if info.get("dtype"):  # review 7 A6: findings that speak of rounding rest on the precision: say it up front
        facts += f", run in {info['dtype']}" + (f" on {info['device']}" if info.get("device") else "")
    cut = below_quick_line(out, names)  # review 11b C3: a default run the budget left smaller than --quick's
    html = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1><p>{escape(facts)}. {with_code(info['BOS'], markdown=False) + ' ' if info.get('BOS') else ''}"
        "Data: the CSV and JSON files beside this report (each "
        "section links its CSVs); "
        "provenance at the bottom and in manifest.json.</p>"
        + (f"<p class='budget-cut'><b>{escape(cut)}</b></p>" if cut else "")
        + _toc_html(toc) + findings + "".join(sections) + _provenance_html(info)
        + "</body></html>"
    )
    bos_md = f". {with_code(info['BOS'], markdown=True)}" if info.get("BOS") else ""
    md = (f"# {md_escape(title)}\n\n{md_escape(facts)}" + bos_md
          + (f"\n\n**{md_escape(cut)}**" if cut else "")
          + "\n\n" + _findings_markdown(names, status, texts) + "\n"
          + "\n".join(md_sections) + "\n" + _provenance_markdown(info))
    io.write_text(out / "report.md", md)
    io.write_text(out / "report.html", html)


def _learned_share(out: Path) -> float | None:
    """Review 19b A2: the learned sinks' mean share of a row on this run's data, over the layers, from the kv analysis's
    sinks records (else position's: their keys_mass, the mass that reaches the keys); None where neither measured it."""
    for name in ("kv", "position"):
        path = out / name / "summary.json"
        if not path.exists():
            continue
        try:
            kept = [r["keys_mass"] for r in io.read_json(path).get("sinks") or []
                    if isinstance(r, dict) and isinstance(r.get("keys_mass"), (int, float))]
        except Exception:  # noqa: BLE001 - a damaged summary: the header says the sinks without the number
            continue
        if kept:
            return float(1 - sum(kept) / len(kept))
    return None
