"""Every figure of two reports, A beside B, for `headscope compare` (reports/compare.py).

Each analysis's PNGs are read from both output folders and inlined side by side, downscaled to
MAX_WIDTH pixels and quantised to PALETTE colours so that two default reports' ~80 figures stay
a couple of MB; a figure only one report has is drawn with the other cell blank and the reason said
(the analysis did not run or failed there, or it ran with settings that skip that figure).
Alt text names the figure, what it shows (its caption) and which run it is from.
"""
from __future__ import annotations

import base64
import io as _io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headscope.reports.compare_run import NOT_COMPARED, SIDES, Run, _analysis_settings
from headscope.reports.findings import caption
from headscope.reports.render import escape

MAX_WIDTH = 900  # px: a pair fills a 1200 px page, so more is not seen
PALETTE = 256  # colours of the quantised PNG: heat maps keep their steps, the page keeps its size
FIGURE_CSS = (".pair{display:grid;grid-template-columns:1fr 1fr;gap:.6em;margin:.6em 0}.pair figure{margin:0;"
              "border:1px solid #eee;padding:.3em}.pair img{max-width:100%;margin:0 auto}")


def thumbnail(path: Path) -> bytes:
    """The PNG at `path` at most MAX_WIDTH wide, quantised to PALETTE colours (an image Pillow cannot
    read is returned as it is)."""
    return _downscale(path.read_bytes())


def _downscale(png: bytes) -> bytes:
    from PIL import Image, UnidentifiedImageError

    source = _io.BytesIO(png)
    try:
        with Image.open(source) as image:
            image = image.convert("RGB")
            if image.width > MAX_WIDTH:
                image = image.resize((MAX_WIDTH, max(1, round(image.height * MAX_WIDTH / image.width))), Image.LANCZOS)
            buf = _io.BytesIO()
            image.quantize(PALETTE).save(buf, format="PNG", optimize=True)
            return buf.getvalue()
    except (OSError, UnidentifiedImageError, ValueError):
        return png


def stems(run: Run, name: str) -> list[str]:
    """The figure stems (PNG files) of analysis `name` in `run`'s folder, sorted."""
    folder = run.path / name
    return sorted(p.stem for p in folder.glob("*.png")) if folder.is_dir() else []


def why_missing(missing: Run, other: Run, name: str, what: str = "this figure") -> str:
    """Why `missing` has no figure of analysis `name` that `other` has: its analysis did not run or failed
    (the manifest's status), or it ran with settings that differ (--quick, the budget's changes, the
    analysis's own settings), or with the same recorded settings (the figure depends on what was found)."""
    if missing.summary(name) is None:
        return f"its {name} analysis has no result ({missing.why_blank(name)})"
    reasons = []
    quick = [bool((r.manifest.get("config") or {}).get("quick")) for r in (missing, other)]
    if quick[0] and not quick[1]:
        reasons.append("it ran with --quick, which skips parts of the analysis")
    changed = (missing.provenance(name) or {}).get("budget_changed") or {}
    if changed:
        reasons.append("its time budget changed " + ", ".join(map(str, changed)))
    settings = [_analysis_settings(r, name) for r in (missing, other)]
    keys = sorted(k for k in set(settings[0]) | set(settings[1]) if k != "quick" and settings[0].get(k) != settings[1].get(k))
    if keys:
        reasons.append(f"its {name} settings differ ({', '.join(keys)})")
    if reasons:
        return f"its {name} ran but did not draw {what}: " + "; ".join(reasons)
    return (f"its {name} ran with the same recorded settings but did not draw {what} (drawn only when its data has "
            "something to show)")


def pair_caption(stem: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str:
    """The caption over a pair of figures: the runs' own (findings.caption with each summary) where both give the
    same, else the caption that holds for either (review 11a B2: an encoder's units are not a decoder's)."""
    own = {caption(stem, a), caption(stem, b)}
    return own.pop() if len(own) == 1 else caption(stem)


def _cell(run: Run, side: str, name: str, stem: str) -> str:
    text = caption(stem, run.summary(name))  # this run's units where they follow its summary
    alt = f"{side} ({run.label}): {name} figure {stem}" + (f": {text}" if text else "")
    data = base64.b64encode(thumbnail(run.path / name / f"{stem}.png")).decode("ascii")
    return (f'<figure><img alt="{escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{side}: {escape(stem)}</b></figcaption></figure>")


def top_attention_png(run: Run) -> bytes | None:
    """The report page's own top_attention figure (drawn from explorer.json, not saved as a PNG), as the
    report draws it (html_report._top_heads_html), downscaled; None without explorer data."""
    import matplotlib.pyplot as plt

    from headscope.reports import io
    from headscope.reports.html_report import EXPLORER_FILE
    from headscope.reports.plots import quiet_reason
    from headscope.reports.plots_attention import heads_facts, top_heads_figure
    from headscope.reports.render import figure_png

    try:
        fig = top_heads_figure(io.read_json(run.path / EXPLORER_FILE), quiet=quiet_reason(run.summary("heads")),
                               facts=heads_facts(run.path))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if fig is None:
        return None
    png = figure_png(fig)
    plt.close(fig)
    return _downscale(png)


def _top_attention_html(a: Run, b: Run) -> tuple[str, list[str]]:
    pngs = [top_attention_png(a), top_attention_png(b)]
    if all(p is None for p in pngs):
        return "", []
    cells = []
    for side, run, png in zip(SIDES, (a, b), pngs):
        if png is None:
            cells.append(f"<figure><em>{escape(f'blank: {side} has no top_attention: no readable explorer data in its folder')}"
                         "</em></figure>")
            continue
        alt = f"{side} ({run.label}): report figure top_attention: {caption('top_attention')}"
        cells.append(f'<figure><img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
                     f"<figcaption><b>{side}: top_attention</b></figcaption></figure>")
    notes = [NOT_COMPARED + f"report figure top_attention: only {'B' if side == 'A' else 'A'} has it; {side} has no readable "
             "explorer data in its folder." for side, png in zip(SIDES, pngs) if png is None]
    return (f"<h3>attention: top_attention</h3><p class='guide'>{escape(caption('top_attention'))}</p>"
            f"<div class='pair'>{''.join(cells)}</div>"), notes


def figures_section(a: Run, b: Run, names: list[str]) -> tuple[str, list[str]]:
    """Every figure both reports have, A beside B, and each figure one report has beside a blank cell saying
    why; notes (NOT_COMPARED) name per analysis the figures only one side drew and why."""
    top, notes = _top_attention_html(a, b)
    parts = [top] if top else []
    for name in names:
        have = [stems(a, name), stems(b, name)]
        every = sorted(set(have[0]) | set(have[1]))
        if not every:
            continue
        rows = []
        for stem in every:
            cells = []
            for side, run, other, own in (("A", a, b, have[0]), ("B", b, a, have[1])):
                blank = f"blank: {side} has no {stem}: {why_missing(run, other, name)}"
                cells.append(_cell(run, side, name, stem) if stem in own else f"<figure><em>{escape(blank)}</em></figure>")
            text = pair_caption(stem, a.summary(name), b.summary(name))
            rows.append(f"<h4>{escape(stem)}</h4>" + (f"<p class='guide'>{escape(text)}</p>" if text else "")
                        + f"<div class='pair'>{''.join(cells)}</div>")
        for side, run, other, own in (("A", a, b, have[0]), ("B", b, a, have[1])):
            lacking = [s for s in every if s not in own]
            if lacking:
                notes.append(NOT_COMPARED + f"{name} figure{'s' if len(lacking) > 1 else ''} {', '.join(lacking)}: only "
                             f"{'B' if side == 'A' else 'A'} has {'them' if len(lacking) > 1 else 'it'}; in {side}, "
                             f"{why_missing(run, other, name, 'them' if len(lacking) > 1 else 'it')}.")
        shared = len(set(have[0]) & set(have[1]))
        parts.append(f"<h3>{escape(name)}: {shared} figure{'s' if shared != 1 else ''} in both, {len(every) - shared} "
                     f"in one only</h3>" + "".join(rows))
    if not parts:
        return "", notes
    return ("<h2 id='figures'>Every figure, A beside B</h2><p>Each report's own figures, downscaled; a blank cell says "
            "why that run has none.</p>" + "".join(parts)), notes
