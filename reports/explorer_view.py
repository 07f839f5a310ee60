"""The attention explorer's HTML: one self-contained fragment (inline CSS and vanilla JS).

`explorer_html(data)` returns a <div> holding the data as a <script type="application/json">
block (every "<", ">" and "&" written as a JSON \\u escape, so no token can close the block),
a stylesheet scoped to `.hsx` (explorer.css) and a script that builds the view with DOM calls
(explorer.js; both files beside this module, read once on import): every token
and label goes in through textContent, never innerHTML. Nothing is fetched. Each fragment has its
own id, so several explorers on one page (notebook cells, report sections) keep apart.

The view: a grid of layers x heads coloured by a per-head score (heads sharing a KV head are
grouped under "kv0", "kv1", ... for GQA/MQA models) with a bar per head for the attention on
the first token (the sink); below it a thumbnail of every head's pattern on the chosen example
(click opens that head, hover previews it, shift+click overlays several: their mean or elementwise
max); the selected head's pattern on the chosen example as a query x key
heatmap with token labels, or as lines between query and key tokens (every label, the token strip and the
tooltips show a space as "␣", a newline as "↵", a tab as "⇥": a byte-level BPE's " Sever" reads "␣Sever" against
the word piece "al", and a lone space token "␣", never a blank row); hovering a token
highlights its row (where it attends) and its column (what attends to it); clicking a query token
pins it, shading every token by that query's attention weight (or, where the report's attribution
analysis scored the example, by an attribution method's signed scores: red positive, blue negative);
the arrow keys move the selected head; a URL fragment #L1H3 opens layer 1, head 3, and #L1H3@patching opens it on
the sample prompt of the report's patching section (an example's "sample_of" lists the sections whose
provenance line shows it; `link_heads` makes such links in the findings).
Attention weights are drawn on one sequential scale, white (0) to dark red (1), as in the figures, shown with its
legend; per-head scores colour the grid as the figures do: a signed score (one below 0) diverging
about 0, red positive, blue negative; an unsigned one (gradient importance, induction, ...) white at
0 to red at its max, never stretched from its min.
A score named in data["muted"] ({score: why}, `muted_scores`: importance measured on a task the model
is at chance on, or under the numerical noise floor) is drawn faint and grey with the reason above the
grid; the thumbnails keep their colours (patterns are not noise). data["floors"] ({score: floor},
`rounding_floors`): cells of that score within the floor are grey and read "≈0", as the heads figure's.
A score named in data["caveats"] ({score: line},
`caveat_scores`: importance from a heads section whose chance guard cannot tell, "undetermined") keeps its colours
with that line above the grid, as the section's finding reads it; data["attribution_caveat"] (the attribution section's)
follows the attribution-shaded tokens' legend line.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from importlib import resources
from typing import Any

from headscope.errors import ConfigError
from headscope.reports.findings import ci_words

# The client: the stylesheet (scoped to .hsx) and the script, kept as their own files beside this module
# (package data); the script reads its explorer's id from the __ID__ it is given in explorer_html.
CSS = (resources.files(__package__) / "explorer.css").read_text(encoding="utf-8")
JS = (resources.files(__package__) / "explorer.js").read_text(encoding="utf-8")

# What the explorer and the notebook's chosen-heads view (tokens_view.pattern_view) draw alike, one copy each, put into
# the script by explorer_html (review 14c C2): the sequential scale's dark end, the scale's note, the hatching's words.
SEQ_END = (103, 0, 13)  # attention weight 1 (the figures' Reds at 1); 0 is white
SCALE_NOTE = "(each query's weights over the keys sum to 1)"
# review 19b A2: a model with a learned sink logit per head (GPT-OSS's `sinks`; data["learned_sinks"])
SINKS_SCALE_NOTE = "(each query's weights over the keys sum to less than 1: the model's learned sink takes the rest)"
MASKED = "masked (outside the sliding window)"  # a hatched cell's tooltip
HATCHED = "hatched cells are keys outside it (masked, not zero attention)"


def seq(value: float) -> str:
    """An attention weight's colour on the sequential scale, white (0) to SEQ_END (1), clipped: explorer.js `seq`."""
    v = min(max(float(value), 0.0), 1.0) if value == value else 0.0
    return "rgb(" + ",".join(str(round(255 + (x - 255) * v)) for x in SEQ_END) + ")"


def window_words(windows: Mapping[int, int]) -> str:
    """'layer 1 attends over a sliding window of 24 keys: hatched cells are ...' for {layer: window}; '' for none."""
    said = [f"layer {l} attends over a sliding window of {w} keys" for l, w in sorted(windows.items()) if w]
    return f"{'; '.join(said)}: {HATCHED}" if said else ""


_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_HEAD = re.compile(r"\bL(\d+)H(\d+)\b")
_TAG = re.compile(r"(<[^>]*>)")
_SECTION = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")  # a section name a link may carry


def link_heads(html: str, n_layers: int, n_heads: int, section: str | None = None) -> str:
    """Escaped HTML with each head name in its text ("L1H3", outside tags and links, within n_layers x
    n_heads) made a link that opens that head in the page's explorer: #L1H3, or #L1H3@<section> when
    `section` names the report section the text is about, which opens the head on that section's
    sample prompt (the example whose sample_of lists it; `section_links` says which sections have one)."""
    tail = f"@{section}" if section and _SECTION.match(section) else ""  # a plain name only
    parts, depth = _TAG.split(html), 0  # text at even indices, tags at odd ones
    for i, part in enumerate(parts):
        if i % 2:
            depth += 1 if re.match(r"<a[\s>]", part, re.I) else -1 if part.lower().startswith("</a") else 0
        elif depth == 0:
            parts[i] = _HEAD.sub(lambda m: f'<a class="head-link" href="#{m[0]}{tail}">{m[0]}</a>'
                                 if int(m[1]) < n_layers and int(m[2]) < n_heads else m[0], part)
    return "".join(parts)


def section_links(data: Mapping[str, Any]) -> set[str]:
    """The report sections whose sample prompt the explorer's data holds (its examples' sample_of)."""
    return {str(s) for e in data.get("examples", []) if isinstance(e, Mapping) for s in e.get("sample_of") or []
            if _SECTION.match(str(s))}


def muted_scores(score_names: Any, heads_summary: Mapping[str, Any] | None) -> dict[str, str]:
    """{score name: why it is noise} for the explorer's grid from the heads analysis's summary: every
    "importance (<method>)" score when summary["chance"] says the model is at chance on the heads task
    (importance is then the effect of heads on noise), and one method's importance when it is under the
    numerical noise floor (degenerate_<method>). Other scores (attention statistics, roles) are of
    the patterns themselves and stay in colour."""
    s = heads_summary if isinstance(heads_summary, Mapping) else {}
    chance = s.get("chance")
    at_chance = isinstance(chance, Mapping) and chance.get("at_chance") is True
    out = {}
    for name in score_names:
        m = re.fullmatch(r"importance \((.+)\)", str(name))
        if not m:
            continue
        said = []
        if at_chance:
            why = chance.get("reason") or "its clean metric is within noise of chance"
            task = f" {s['task']}" if s.get("task") else ""
            where = "below" if chance.get("below_chance") is True else "at"
            said.append(f"the model is {where} chance on the heads task{task} ({why}), so these importances measure "
                        "noise, not a mechanism.")
        if under_floor(name, s):  # said at chance too (review 15a C2: the grid said only "at chance" of them)
            floor = s[f"degenerate_{m[1]}"]
            what = ("the loss changes these gradients predict are under the numerical floor" if m[1] == "gradient"
                    else "within numerical noise")
            said.append(f"{'Also, ' + what if said else what}: {floor}.")
        if said:
            out[name] = " ".join(said)
    return out


def rounding_floors(score_names: Any, heads_summary: Mapping[str, Any] | None) -> dict[str, float]:
    """{score name: rounding floor} for the grid's ablation importances whose heads summary records one
    (rounding_floor_<method>, > 0): the grid greys a cell with |value| under it and labels it "≈0", the rule the
    heads importance figure applies (plots_heads.plot_importance; review 15av C2). The gradient's floor bounds its
    predicted loss change, not the gradient, so the gradient is muted whole (muted_scores), not per cell."""
    s = heads_summary if isinstance(heads_summary, Mapping) else {}
    out = {}
    for name in score_names:
        m = re.fullmatch(r"importance \((.+)\)", str(name))
        floor = s.get(f"rounding_floor_{m[1]}") if m and m[1] != "gradient" else None
        if isinstance(floor, (int, float)) and not isinstance(floor, bool) and floor > 0:
            out[str(name)] = float(floor)
    return out


def under_floor(name: str, heads_summary: Mapping[str, Any] | None) -> bool:
    """Whether the importance score `name` ("importance (<method>)") is under its numerical floor: the heads summary's
    degenerate_<method> (heads_words.degenerate_words says what that means for a gradient and an ablation)."""
    m = re.fullmatch(r"importance \((.+)\)", str(name))
    return bool(m) and isinstance(heads_summary, Mapping) and isinstance(heads_summary.get(f"degenerate_{m[1]}"), str)


def undetermined_caveat(summary: Mapping[str, Any] | None, section: str, what: str) -> str:
    """One short line for what the explorer draws from `section`'s results where that section's chance guard cannot tell
    (chance.assess's "undetermined"; the section's finding opens with findings.undetermined_sentence): 'Read with a
    caveat: on its 4 examples the heads section cannot tell the model from chance on task kv (logit difference 1.3, 95%
    CI [-0.7, 3.3]; too wide to tell either way), as its finding says of these importances.'; '' otherwise."""
    entry = summary.get("chance") if isinstance(summary, Mapping) else None
    if not isinstance(entry, Mapping) or entry.get("undetermined") is not True or entry.get("at_chance") is True:
        return ""
    num = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else None  # noqa: E731
    n, mean, ci = num(entry.get("n_examples")), num(entry.get("mean")), entry.get("ci")
    metric = str(entry.get("metric") or "metric").replace("logit_diff", "logit difference").replace(
        "logprob", "answer log-probability")
    said = [f"{metric} {mean:.3g}"] if mean is not None else []
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(num(c) is not None for c in ci):
        said.append(ci_words((ci[0], ci[1]), ".3g", num(entry.get("ci_level")) or 0.95))
    task = entry.get("task") or (summary or {}).get("task")
    return (f"Read with a caveat: {f'on its {n:.0f} examples ' if n is not None else ''}the {section} section cannot "
            f"tell the model from chance" + (f" on task {task}" if isinstance(task, str) and task else "")
            + f" ({', '.join(said)}{'; ' if said else ''}too wide to tell either way), as its finding says of {what}.")


def caveat_scores(score_names: Any, heads_summary: Mapping[str, Any] | None) -> dict[str, str]:
    """{score name: caveat} for the grid's importance scores (those `muted_scores` names when at chance) where the heads
    section's chance verdict is undetermined (`undetermined_caveat`); the patterns' own statistics carry none."""
    note = undetermined_caveat(heads_summary, "heads", "these importances")
    return {str(n): note for n in score_names if note and re.fullmatch(r"importance \((.+)\)", str(n))}


def json_for_script(data: Any) -> str:
    """JSON safe inside a <script> element: "<", ">" and "&" as \\u escapes (no "</script>", no "<!--")."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def explorer_html(data: Mapping[str, Any], uid: str | None = None) -> str:
    """The explorer as a self-contained HTML fragment (inline CSS, data and script; nothing fetched).

    uid: the fragment's element id (letters, digits, "-", "_"); a fresh random one when None, so
    that several explorers on one page keep apart."""
    uid = uid or f"hsx-{uuid.uuid4().hex[:12]}"
    if not _ID.match(uid):
        raise ConfigError(f"explorer id {uid!r} must be letters, digits, '-' or '_', starting with a letter.")
    script = (JS.replace("__ID__", json.dumps(uid)).replace("__SEQ__", json.dumps(list(SEQ_END)))
              .replace("__SCALE_NOTE__", json.dumps(SINKS_SCALE_NOTE if data.get("learned_sinks") else SCALE_NOTE))
              .replace("__HATCHED__", json.dumps(HATCHED))
              .replace("__MASKED__", json.dumps(MASKED)))
    return (
        f'<div class="hsx" id="{uid}"><style>{CSS}</style>'
        f'<script type="application/json" class="hsx-data">{json_for_script(data)}</script>'
        '<noscript><p>The attention explorer needs JavaScript.</p></noscript>'
        f'<div class="hsx-app"></div><script>{script}</script></div>'
    )


__all__ = ["CSS", "HATCHED", "JS", "MASKED", "SCALE_NOTE", "SEQ_END", "SINKS_SCALE_NOTE", "caveat_scores", "explorer_html",
           "json_for_script",
           "link_heads", "muted_scores", "rounding_floors", "section_links", "seq", "undetermined_caveat", "under_floor",
           "window_words"]
