"""`headscope compare OUT_A OUT_B`: one self-contained HTML page setting two reports side by side.

Reads only the files of two output folders (manifest.json, <analysis>/summary.json, task.json, CSVs and
PNGs): each analysis's finding for A and B, head importance in raw units on one scale (A and B: sequential
from 0 for gradient importance, else diverging; B - A diverging with the cells within the runs' own
uncertainty grey, `noise_band`), the pruning curves and position curves of both on shared axes where they
are compared (A wide and pale, B thin and dashed on top), the top patching sites, and every figure of both
reports A beside B (compare_figures.py), with the differences called out in words: first every setting
that differs (per analysis its task, source, n and budget changes too), each headline difference (the
prunable fraction of the ordering each heads finding leads with first) marked within or beyond the runs'
own 95% intervals (only between runs that ran that analysis on one task: compare_run.tasks_differ), each
blank cell with its reason, what is not compared and why in its own list, and
both runs' provenance at the end. Each headline is the number its report's finding states with the interval
that finding prints (compare_headlines.py). Top heads are not compared where a report does not rank them (at
chance, importance that is rounding, tied top heads), nor patching positions or position curves of different
prompts.
Every string from the folders is escaped; figures are inline PNG.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from headscope.errors import ConfigError, OutputError, OutputExistsError
from headscope.reports import io
from headscope.reports.compare_aligned import aligned_note, aligned_pairs, same_slots
from headscope.reports.compare_figures import FIGURE_CSS, figures_section
from headscope.reports.compare_headlines import headline_notes
from headscope.reports.compare_heads import (  # noqa: F401 (importance_figure: the page's part, tested)
    importance_figure,
    importance_section,
)
from headscope.reports.compare_measures import R_LABEL, site_not_run
from headscope.reports.compare_notes import n_words
from headscope.reports.compare_patching import corrupted_token_notes, path_notes
from headscope.reports.compare_pruning import pruning_notes, pruning_section  # noqa: F401 (pruning_notes: tested)
from headscope.reports.compare_run import (  # noqa: F401 (Run, _overlay: read by the tests through this module)
    NATURAL_RANGE,
    NO_INTERVAL,
    NOT_COMPARED,
    OVERLAY_TITLE,
    PRECISION_BITS,
    ROUNDING,
    SAME,
    SIDES,
    Run,
    _img,
    _number,
    _overlay,
    chance_refusal,
    comparison_floor,
    dtype_of,
    dtype_step,
    idle_settings,
    precision_only,
    rounding_move,
    rounding_premise,
    same_model_words,
    same_rows,
    tasks_differ,
)
from headscope.reports.findings import _ci, _words, ci_pair, finding
from headscope.reports.html_report import CSS, _provenance
from headscope.reports.patching_sites import KV_SITES, by_construction, share, tied
from headscope.reports.patching_words import _gap
from headscope.reports.provenance import _count_text as count_text
from headscope.reports.provenance import provenance_lines, setting_change, speed_text
from headscope.reports.render import escape
from headscope.reports.resume_settings import bos_option


def position_section(a: Run, b: Run) -> tuple[str, list[str]]:
    """Both runs' position curves of the plotted metric on one axis (its natural range, integer slots), where they
    are compared: neither at chance, the same metric plotted, the same prompts (the x axis is a slot of each run's
    own prompts); otherwise no overlay, only the reason (each report's own figures are side by side in the figures
    section). The middle/ends ratio is compared only where both reports state it (their curves are not flat)."""
    from headscope.reports.plots_position import FLAT

    curves = []
    sums = [r.summary("position") or {} for r in (a, b)]
    primaries = [s.get("primary_metric", "accuracy") for s in sums]
    for run, primary in zip((a, b), primaries):
        c = run.table("position", "curve")
        ok = c is not None and {"condition", "metric", "position", "mean"} <= set(c.columns)
        curves.append(c[(c["condition"] == "full") & (c["metric"] == primary)] if ok else None)  # one scale per axis
    if all(c is None for c in curves):
        return "", []
    label = f"Middle/ends ratio of {primaries[0]} (the metric plotted)"
    blank = [(side, run) for side, run in zip(SIDES, (a, b)) if run.summary("position") is None]
    if blank:  # one side never ran it (or it failed): no metric of its own to set against the other's
        why = "Position curves and middle/ends ratio: not compared: " + "; ".join(
            f"{side} has no position result ({run.why_blank('position')})" for side, run in blank) + "."
        return ("<p><em>no overlay: " + escape(why) + " Each report's own position figures are below, side by side."
                "</em></p>", [NOT_COMPARED + why])
    refused = chance_refusal(a, b, "position")
    differ = tasks_differ(a, b, "position") or prompts_differ(a, b, "position")
    if refused or primaries[0] != primaries[1] or differ:
        why = (f"{label}: {refused}." if refused else
               f"Position curves and middle/ends ratio: not compared: A plots {primaries[0]}, B {primaries[1]}."
               if primaries[0] != primaries[1] else
               f"Position curves and middle/ends ratio: not compared: {differ}.")
        return ("<p><em>no overlay: " + escape(why) + " Each report's own position figures are below, side by side."
                "</em></p>", [NOT_COMPARED + why])
    notes = []
    ratios = [(s.get("ratio_middle_to_ends") or {}).get(m) for s, m in zip(sums, primaries)]
    spans = [[v for v in ((s.get("metric_per_position") or {}).get(m) or {}).values() if _number(v)]
             for s, m in zip(sums, primaries)]
    flat = [side for side, v in zip(SIDES, spans) if v and max(v) - min(v) < FLAT]  # its finding states no ratio
    if flat and all(_number(r) for r in ratios):
        notes.append(NOT_COMPARED + f"{label}: not compared: {' and '.join(flat)}'s curve is flat (its values span less "
                     f"than {FLAT}), so {'its report states' if len(flat) == 1 else 'their reports state'} no ratio.")
    elif all(_number(r) for r in ratios) and abs(ratios[0] - ratios[1]) >= 0.05:
        n = n_words(*sums)
        notes.append(f"{label}: A {ratios[0]:.2f}, B {ratios[1]:.2f} ({n})" + NO_INTERVAL)
    elif all(_number(r) for r in ratios):  # compared, and closer than the threshold: said as agreement
        notes.append(SAME + f"{label}: A {ratios[0]:.2f}, B {ratios[1]:.2f}, within 0.05 of each other.")
    else:  # the curves are set side by side without a ratio of both: still a comparison made
        notes.append(SAME + f"Position curves of {primaries[0]}: drawn on shared axes below; the reports state no "
                     "middle/ends ratio of both to set against each other.")
    fig = _overlay(curves, "metric", "position", "mean", "gold position (slot)", f"{primaries[0]} (mean over examples)",
                   f"position curves: {OVERLAY_TITLE}", y_range=NATURAL_RANGE.get(primaries[0]), integer_x=True)
    return _img(fig, f"position curves of {primaries[0]} of A and B on shared axes, {OVERLAY_TITLE}"), notes


def _site_name(kind: str, cell: Mapping[str, Any]) -> str:
    """'resid_pre L0 pos -1 from the end (' is')', as the patching finding names a site: a position counted from
    the end (left-padded prompts) without the token column's "i: " (the padded frame's index), the token quoted
    like repr; "(its token differs across prompts)" where the column is empty. A k or v cell's head is a KV head:
    'v L0 KV0'."""
    parts = [kind, f"L{cell.get('layer')}"]
    if cell.get("head") is not None:
        parts.append(f"{'KV' if kind in KV_SITES else 'H'}{cell['head']}")  # review 9b A3: k/v index KV heads
    if cell.get("pos") is not None:
        end = cell.get("from_end")
        token = re.sub(r"^-?\d+: ", "", str(cell.get("token") or ""))  # the index is said once, on this axis
        at = f"pos {end} from the end" if isinstance(end, int) and not isinstance(end, bool) else f"pos {cell['pos']}"
        parts.append(f"{at} ({token!r})" if token else f"{at} (its token differs across prompts)")
    return " ".join(map(str, parts))


def patching_section(a: Run, b: Run, n: int = 3) -> tuple[str, list[str]]:
    """The top sites of each site type, A and B in adjacent columns; differing first sites are noted."""
    tops = [(r.summary("patching") or {}).get("top_sites") or {} for r in (a, b)]
    kinds = list(dict.fromkeys([*tops[0], *tops[1]]))
    if not kinds:
        return "", []
    rows, notes = [], []
    refused = chance_refusal(a, b, "patching")
    if refused:  # each report ranks no site at chance: shares of a gap between chance-level metrics are noise
        return (f"<p><em>blank: top patching sites {escape(refused)}</em></p>",
                [NOT_COMPARED + f"Top patching sites: {refused} (its report ranks no site)."])
    sums = [r.summary("patching") or {} for r in (a, b)]
    noisy = [side for side, s in zip(SIDES, sums) if isinstance(s.get("gap_within_noise"), Mapping)]
    if noisy:
        why = f"not compared: {' and '.join(noisy)} {'has a' if len(noisy) == 1 else 'have'} clean-corrupted gap within noise"
        return (f"<p><em>blank: top patching sites {escape(why)}</em></p>",
                [NOT_COMPARED + f"Top patching sites: {why} (its report ranks no site)."])
    other_task = tasks_differ(a, b, "patching")
    if other_task:  # a site's effect on another task's gap: no site of one is set against the other's
        return (f"<p><em>blank: top patching sites not compared: {escape(other_task)}</em></p>",
                [NOT_COMPARED + f"Top patching sites: not compared: {other_task}."])
    gaps = [_gap(s) for s in sums]
    floor = comparison_floor(sums, gaps)
    differ = prompts_differ(a, b, "patching")
    rounding = rounding_pair(a, b)  # one model on the same examples in two dtypes: differences are its rounding
    verdicts: dict[str, str] = {}  # each site type's first row's verdict
    unmatched: list[str] = []  # site types whose positions name tokens of different prompts
    for kind in kinds:
        cells = [t.get(kind, [])[:n] for t in tops]
        if differ and any(c.get("pos") is not None for side in cells for c in side):
            blank = f"<em>blank: positions are not compared: {escape(differ)}</em>"
            rows.append(f"<tr><td>{escape(kind)}</td><td>{blank}</td><td>{blank}</td><td></td></tr>")
            unmatched.append(kind)
            continue
        for i in range(max(len(c) for c in cells)):
            row = [escape(kind) if i == 0 else ""]
            for side, gap, s, run in zip(cells, gaps, sums, (a, b)):
                cell = side[i] if i < len(side) else None
                effect = float(cell.get("effect", float("nan"))) if cell is not None else 0.0
                unrun = "" if side else site_not_run("patching", R_LABEL + kind, s, run)  # 16b C1: why it is blank
                row.append(f"<em>({escape(unrun or f'its summary lists {len(side)} {kind} site(s)')})</em>" if cell is None
                           else f"{escape(_site_name(kind, cell))}: {escape(_effect_text(effect, gap, s, cell))}"
                           + (f" <em>({escape(floor[1])}: rounding, not ranked)</em>" if _under(cell, floor) else ""))
            pair = [side[i] if i < len(side) else None for side in cells]
            verdict = _row_verdict(kind, pair, gaps, floor, rounding)
            verdicts.setdefault(kind, verdict)
            row.append(escape(verdict))
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
        firsts = [tuple(c[0].get(k) for k in ("layer", "head", "pos")) if c else None for c in cells]
        swap = _tied_swap(kind, [t.get(kind) or [] for t in tops], gaps, sums) if all(firsts) else None
        if all(firsts) and all(_under(c[0], floor) for c in cells):  # neither run has a site of this type
            notes.append(SAME + f"Top {kind} site: not a difference: both runs' first {kind} cells are {floor[1]} "
                                f"(A {_with_ci(kind, cells[0][0], gaps[0])}, B {_with_ci(kind, cells[1][0], gaps[1])}).")
        elif all(firsts) and firsts[0] != firsts[1] and swap:
            notes.append(SAME + f"Top {kind} site: A lists {_site_name(kind, cells[0][0])} first, B "
                                f"{_site_name(kind, cells[1][0])}: not a difference, {swap}.")
        elif all(firsts) and firsts[0] != firsts[1] and verdicts.get(kind, "").startswith(NO_DIFFERENCE):
            notes.append(SAME + f"Top {kind} site: A lists {_site_name(kind, cells[0][0])} first, B "
                                f"{_site_name(kind, cells[1][0])}: not a difference: {verdicts[kind]}.")
        elif all(firsts) and firsts[0] != firsts[1]:
            # review 7 A0: its own name; `n` (the sites listed per type) is read again by the next site type
            counts = f" ({n_words(*sums)})" if sums[0].get("n_examples") != sums[1].get("n_examples") else ""
            notes.append(f"Top {kind} site differs: A {_site_name(kind, cells[0][0])}, "
                         f"B {_site_name(kind, cells[1][0])}{counts}"
                         f"{_top_ties(kind, [t.get(kind) or [] for t in tops], gaps)}.")
    aligned = aligned_pairs(*sums) if unmatched else []
    for kind, where, ca, cb in aligned:  # review 13a C4: the same word of the template in both runs' prompts
        texts = tuple(f"L{c.get('layer')}: {_effect_text(float(c['effect']), gap, s, c)}" for c, gap, s in
                      zip((ca, cb), gaps, sums))
        rows.append(f"<tr><td>{escape(kind)} aligned on {escape(where)}</td>"
                    + "".join(f"<td>{escape(t)}" + (f" <em>({escape(floor[1])}: rounding, not ranked)</em>"
                                                     if _under(c, floor) else "") + "</td>" for t, c in zip(texts, (ca, cb)))
                    + f"<td>{escape(_row_verdict(kind, [ca, cb], gaps, floor, rounding))}</td></tr>")
        if not (_under(ca, floor) and _under(cb, floor)):
            notes.append(aligned_note(kind, where, (ca, cb), texts, False))
    if unmatched:  # one line for every site type with positions
        slots = same_slots(*sums)
        instead = ("; compared instead aligned on the positions where clean and corrupted differ, the same words of "
                   "the task in both runs' prompts (below the end-aligned rows)" if aligned else
                   f"; nor aligned on the differing positions: {slots}" if slots else "")
        notes.append(NOT_COMPARED + f"Top {', '.join(unmatched)} sites are not compared end-aligned: {differ}{instead}.")
    # review 18d C4: the findings' position-free numbers, compared whichever prompts each run drew
    notes += corrupted_token_notes(sums, gaps, floor, rounding) + path_notes(sums, gaps, floor, rounding)
    table = ("<table><tr><th>site type</th><th>A: site: effect</th><th>B: site: effect</th><th>A vs B</th></tr>"
             + "".join(rows) + "</table>")
    if rounding is not None:  # the premise of every row's verdict, said once (review 17a C1)
        table = f"<p>{escape(rounding.premise())}</p>" + table
    return table, notes


def _under(cell: Mapping[str, Any] | None, floor: tuple[float, str] | None) -> bool:
    """Whether a top-sites cell's raw effect is under the comparison's rounding floor (comparison_floor)."""
    return (cell is not None and floor is not None and _number(cell.get("effect"))
            and abs(float(cell["effect"])) < floor[0])


def _cell_key(cell: Mapping[str, Any]) -> tuple:
    """Which patching cell a top-sites entry is, whatever its effect: (layer, head, pos)."""
    return tuple(cell.get(k) for k in ("layer", "head", "pos"))


def _top_ties(kind: str, tops: list[list], gaps: list) -> str:
    """The noise verdict on a differing top site: ' (tied in A: <top>, <other>, each inside the other's 95% interval)'
    for each run whose top cell is tied (patching_sites.tied) with its next cell or with the other run's top site;
    ' (tied in neither run: ...)' where both runs give intervals and neither is tied; '' without intervals."""
    keys = [_cell_key(c[0]) for c in tops]
    ties, clear = [], True
    for side, cells, gap, other in zip(SIDES, tops, gaps, keys[::-1]):
        rivals = cells[1:2] + [c for c in cells[1:] if _cell_key(c) == other]
        found = next((c for c in rivals if tied(cells[0], c)), None)
        if found is not None:
            ties.append(f"tied in {side}: {_with_ci(kind, cells[0], gap)} and {_with_ci(kind, found, gap)} are each "
                        "inside the other's 95% interval")
        clear = clear and bool(rivals) and all(isinstance(c.get("ci"), (list, tuple)) for c in (cells[0], *rivals))
    if ties:
        return " (" + "; ".join(ties) + ")"
    return (" (tied in neither run: in each, its top site and its next are not each inside the other's 95% interval)"
            if clear else "")


def _tied_swap(kind: str, tops: list[list], gaps: list, sums: list) -> str | None:
    """Why two runs' differing top sites are no difference, or None: each run lists the other's top cell too, and in
    each run the two are tied (each inside the other's 95% interval), so which comes first is arbitrary in both
    (review 11c C1: resid_pre L1 and L2 at the answer position, both 1.00 of the gap in float32 and bfloat16, were
    listed as a difference); where both cells carry the whole gap at the answer position in both runs, equal by
    construction (patching_sites.by_construction), that is the reason given."""
    keys = [_cell_key(c[0]) for c in tops]
    pairs = []
    for cells, other in zip(tops, keys[::-1]):
        match = next((c for c in cells[1:] if _cell_key(c) == other), None)
        if match is None or not tied(cells[0], match):
            return None
        pairs.append((cells[0], match))
    whole = [by_construction([(kind, c) for c in pair], gap, bool(s.get("normalized")))
             for pair, gap, s in zip(pairs, gaps, sums)]
    ties = "; ".join(f"{side}: {_with_ci(kind, x, gap)} and {_with_ci(kind, y, gap)}"
                     for side, (x, y), gap in zip(SIDES, pairs, gaps))
    if all(len(w) == 2 for w in whole):
        return ("both cells carry the whole gap at the answer position in both runs, equal by construction (the "
                "residual stream where the metric is read, once the information has arrived there), so which is "
                f"listed first is arbitrary ({ties})")
    return ("the two cells are tied in both runs, each inside the other's 95% interval, so which is listed first is "
            f"arbitrary ({ties})")


@dataclass(frozen=True)
class RoundingPair:
    """A and B are one model on the same examples in two dtypes (compare_run.precision_only, same_rows): a difference
    between their patching cells is the lower dtype's rounding, not sampling noise (review 17a C1), judged against its
    rounding step at the effect's size (`step`). `tops`: each run's listed cells of every site type, to read the
    other run's cell where a row's cells differ."""

    low: str
    dtypes: str
    tops: tuple[Mapping[str, Any], Mapping[str, Any]]
    unit: str = ""  # " logit difference": the metric's words after a raw number

    def step(self, sizes: list[float], floor: tuple[float, str] | None) -> tuple[float, str]:
        """(the rounding step a difference at these sizes is judged against, its words): the larger of one step of
        the lower dtype at the largest size (2^(exponent - significand bits + 1)) and the runs' rounding floor."""
        return dtype_step(self.low, sizes, floor)

    def premise(self) -> str:
        return (f"A and B are one model on the same examples in two dtypes ({self.dtypes}): a difference between their "
                f"cells is {self.low}'s rounding, not sampling noise, so the last column judges it against {self.low}'s "
                f"rounding step at the effect's size (the larger of one {self.low} step there and the runs' rounding "
                "floor), not by the examples' 95% intervals.")

    def effect(self, side: int, kind: str, key: tuple) -> float | None:
        """Run `side`'s effect of cell `key` where its summary lists it (the top cells of its site type)."""
        cell = next((c for c in self.tops[side].get(kind) or [] if _cell_key(c) == key), None)
        return float(cell["effect"]) if cell is not None and _number(cell.get("effect")) else None


def rounding_pair(a: Run, b: Run) -> RoundingPair | None:
    """The RoundingPair of A and B's patching, None where they are not one model on the same examples in two dtypes."""
    sides = precision_only(a, b)
    if sides is None or not same_rows(a, b, "patching"):
        return None
    sums = [r.summary("patching") or {} for r in (a, b)]
    metric = _words(sums[0].get("metric", "")) if not sums[0].get("normalized") else ""
    return RoundingPair(low=dtype_of((a, b)[sides[1]]), dtypes=f"A {dtype_of(a)}, B {dtype_of(b)}",
                        tops=(sums[0].get("top_sites") or {}, sums[1].get("top_sites") or {}),
                        unit=f" {metric}" if metric else "")


NO_DIFFERENCE = ("within noise", "the same cell", "different cells, neither", "different cells ranked apart",
                 "different cells;")  # the starts of a row verdict that says the runs do not differ there


def _clear_of_zero(cell: Mapping[str, Any]) -> bool | None:
    """Whether a cell's 95% interval (raw units) excludes 0; None without one."""
    ci = ci_pair(cell.get("ci"))
    return None if ci is None else min(ci) > 0 or max(ci) < 0


def _row_verdict(kind: str, pair: list, gaps: list, floor: tuple[float, str] | None = None,
                 rounding: RoundingPair | None = None) -> str:
    """Whether A's and B's cells of one table row differ beyond the runs' noise (review 9a C8: "L0H2: 0.48 of the gap"
    against "0.37" was given bare, though each lies inside the other's 95% interval): each share of its own run's gap
    inside the other's interval is "within noise", as compare says of taus; '' where either has no interval. Cells
    both under the runs' rounding floor (comparison_floor) are within noise whatever their intervals: no site in
    either run (review 13a A4); different cells whose 95% intervals both reach 0 are no site in either run (review 17a
    C1). Where A and B are one model on the same examples in two dtypes (`rounding`), the examples' intervals do not
    judge a difference between them: a cell's |B - A| is the lower dtype's rounding, within or beyond its rounding
    step at the effect's size (RoundingPair.step), and different cells are ranked apart by rounding where neither
    cell moves by more than that step between the runs (review 17a C1: 8.24 against 8.22 logits, a third of one
    bfloat16 step at 8, was called "beyond noise")."""
    if any(c is None for c in pair):
        return ""
    if all(_under(c, floor) for c in pair):
        return f"within noise: both cells are {floor[1]}: no site in either run, not ranked"
    same = _cell_key(pair[0]) == _cell_key(pair[1])
    under = [side for side, c in zip(SIDES, pair) if _under(c, floor)]
    if under and not same:  # one run's cell is rounding: no site to set against the other's
        return f"different cells; {under[0]}'s is {floor[1]}: not a site"
    if not same and all(_clear_of_zero(c) is False for c in pair):
        return "different cells, neither clear of 0 in its own run (each 95% CI reaches 0): no site in either run"
    if rounding is not None:
        return _rounding_verdict(kind, pair, gaps, floor, rounding, same)
    said = [share(c, gap, gap is None) for c, gap in zip(pair, gaps)]
    if any(x is None or x[1] is None for x in said):
        return ""
    (va, ca), (vb, cb) = said
    mutual = tied({"effect": va, "ci": ca}, {"effect": vb, "ci": cb})
    if same:
        return ("within noise: each inside the other's 95% interval" if mutual
                else "beyond noise: not each inside the other's 95% interval")
    return ("different sites, their effects within noise: each inside the other's 95% interval" if mutual
            else "different sites")


def _rounding_verdict(kind: str, pair: list, gaps: list, floor: tuple[float, str] | None, rounding: RoundingPair,
                      same: bool) -> str:
    """_row_verdict's words on one model in two dtypes (RoundingPair): the same cell's |B - A| against the rounding
    step, or different cells ranked apart by rounding (neither moves by more than the step between the runs, each
    read in both runs' lists), else different sites."""
    effects = [float(c["effect"]) for c in pair]
    unit = rounding.unit
    if same:
        diff = abs(effects[1] - effects[0])
        step, why = rounding.step(effects, floor)
        if diff <= step:
            return (f"the same cell; |B - A| = {diff:.3g}{unit}, {rounding.low}'s rounding: within its step here "
                    f"({step:.3g}: {why})")
        return (f"beyond rounding: |B - A| = {diff:.3g}{unit}, more than {rounding.low}'s step here ({step:.3g}: "
                f"{why}): the precision changes the computation here, not only its rounding")
    keys = [_cell_key(c) for c in pair]
    table = [[rounding.effect(side, kind, key) for key in keys] for side in (0, 1)]  # [run][cell]
    if any(x is None for row in table for x in row):
        return "different sites"
    moves = [abs(table[1][i] - table[0][i]) for i in (0, 1)]
    step, why = rounding.step([x for row in table for x in row], floor)
    said = f"A's cell moves by {moves[0]:.2g} and B's by {moves[1]:.2g}{unit} between the runs"
    if max(moves) <= step:
        return (f"different cells ranked apart by {rounding.low}'s rounding: {said}, within its rounding step here "
                f"({step:.3g}: {why})")
    return f"different sites: {said}, more than {rounding.low}'s rounding step here ({step:.3g}: {why})"


def _with_ci(kind: str, cell: Mapping[str, Any], gap: float | None) -> str:
    """'head_out L0 H1 (0.14 of the gap, 95% CI [0.04, 0.25])': a site with its effect and interval in the report's unit."""
    said = share(cell, gap, gap is None)
    if said is None:
        return _site_name(kind, cell)
    value, ci = said
    unit = " of the gap" if gap is not None else ""
    return f"{_site_name(kind, cell)} ({value:.2f}{unit}{_ci(ci)})"


def _effect_text(effect: float, gap: float | None, s: Mapping[str, Any], cell: Mapping[str, Any] | None = None) -> str:
    """An effect in the report's own unit: its share of the clean-corrupted gap with the raw value in the task
    metric beside it ("0.98 of the gap (+24.1 logit difference)"), or the normalised effect as is; with the cell's
    95% interval where it has one, as its report's finding states it ("0.48 of the gap, 95% CI [0.12, 0.84] (...)")."""
    said = share(cell, gap, gap is None) if cell is not None else None
    ci = _ci(said[1]) if said is not None else ""
    if gap is None:
        return f"{effect:.2f} of the gap{ci} (normalised)" if s.get("normalized") else f"{effect:.3g}{ci}"
    return f"{effect / gap:.2f} of the gap{ci} ({effect:+.3g} {_words(s.get('metric', ''))})"


DID = {"patching": "patched", "position": "swept"}  # what each analysis did with its prompts
WHY = {"patching": "a position names a token of the prompts its own run patched",
       "position": "a slot is a place in each run's own prompts, so the curves are of different prompts"}


def prompts_differ(a: Run, b: Run, name: str) -> str:
    """Why runs A and B did not run analysis `name` on the same prompts ("" when they did, as far as
    their records tell: one model, seed, task, example count and sample prompt). A position indexes
    its own run's prompts, so positions of different prompts name different tokens."""
    pa, pb = a.provenance(name) or {}, b.provenance(name) or {}
    sa, sb = (pa.get("sample") or {}).get("prompt"), (pb.get("sample") or {}).get("prompt")
    model = [(r.manifest.get("model") or {}).get("name") for r in (a, b)]
    checks = [("seed", a.manifest.get("seed"), b.manifest.get("seed")),
              ("task", pa.get("task"), pb.get("task")), ("examples", pa.get("n_examples"), pb.get("n_examples"))]
    if sa is None or sb is None:  # no sample to compare: another model may tokenize (or sample) otherwise
        checks.insert(0, ("model", *model))  # (two checkpoints of one model, with equal samples, are compared)
    diffs = [f"{what} {x} vs {y}" for what, x, y in checks if x != y]
    if sa is not None and sb is not None and sa != sb:
        diffs.append("their sample prompts differ")
    if not diffs:
        return ""
    return (f"A and B {DID.get(name, 'used')} different prompts (" + ", ".join(diffs)
            + f"), and {WHY.get(name, 'the prompts differ')}")


def _bos_added(config: Mapping[str, Any]) -> str:
    """The BOS headscope put in front of every prompt ("none"; "not recorded" in a manifest from before review 10b)."""
    return "not recorded" if "bos_added" not in config else str(config["bos_added"] or "none")


def settings_notes(a: Run, b: Run, names: list[str]) -> list[str]:
    """Every setting that differs between the runs: model, task, seed, --quick, --n-examples, budget,
    precision and device, the BOS headscope prepends, the commit and package versions (manifest.json), and per
    analysis the task it ran on with its source, its example count and what the budget changed (its section
    provenance, reports/provenance.py)."""
    ma, mb = a.manifest, b.manifest
    ca, cb = ma.get("config") or {}, mb.get("config") or {}
    rows = [("model", (ma.get("model") or {}).get("name"), (mb.get("model") or {}).get("name")),
            ("task", ca.get("task") or "default", cb.get("task") or "default"), ("seed", ma.get("seed"), mb.get("seed")),
            ("--quick", bool(ca.get("quick")), bool(cb.get("quick"))),
            # review 19w C1: a run of some analyses against one of all (its sections' absence said under Not compared)
            ("analyses run", _analyses_text(ca), _analyses_text(cb)),
            ("--n-examples", ca.get("n_examples"), cb.get("n_examples")),
            ("budget (minutes)", ca.get("budget_minutes"), cb.get("budget_minutes")),
            # review 7 A6: a precision change alone moves rounding-level results (older manifests: not recorded)
            ("dtype", ca.get("dtype"), cb.get("dtype")), ("device", ca.get("device"), cb.get("device")),
            # review 10b A1: a BOS headscope put in front of every prompt changes every absolute number
            ("BOS option", bos_option(ca.get("prepend_bos")), bos_option(cb.get("prepend_bos"))),
            ("BOS headscope prepends (the tokenizer adds none)", _bos_added(ca), _bos_added(cb)),
            ("commit", ma.get("git_sha"), mb.get("git_sha"))]
    rows += architecture_rows(ma.get("model") or {}, mb.get("model") or {})  # review 20c B2
    va, vb = ma.get("versions") or {}, mb.get("versions") or {}
    if isinstance(va, dict) and isinstance(vb, dict):
        rows += [(f"{pkg} version", va.get(pkg), vb.get(pkg)) for pkg in sorted(set(va) | set(vb))]
    for name in names:
        pa, pb = a.provenance(name), b.provenance(name)
        if pa is None or pb is None:  # one side has no result: the findings table says why
            continue
        rows.append((f"{name} task", _task_text(pa), _task_text(pb)))
        rows.append((f"{name} examples", *(count_text(p) if isinstance(p.get("n_examples"), int) else p.get("n_examples")
                                           for p in (pa, pb))))  # "2375 token positions of 64 sentences" (11b N8)
        idle = idle_settings(a, b, name)  # review 17a A2: a change to a part that runs in neither run is no setting
        ca, cb = ({k: v for k, v in (p.get("budget_changed") or {}).items() if k not in idle} for p in (pa, pb))
        if ca != cb:  # review 14c-v C2: equal changes fitted to other speeds: no setting differs
            rows.append((f"{name} budget changes", _budget_text(pa, idle), _budget_text(pb, idle)))
    same = same_model_words(a, b)  # review 15c C1: a dtype copy of one model is no model difference
    return [f"{what}: A {'not set' if x is None else x}, B {'not set' if y is None else y}"
            + (f" ({same})." if what == "model" and same else ".") for what, x, y in rows if x != y]


ARCHITECTURE = (("family", "architecture"), ("n_layers", "layers"), ("n_heads", "heads per layer"),
                ("n_kv_heads", "KV heads per layer"), ("d_model", "d_model"), ("d_head", "d_head"), ("d_mlp", "d_mlp"),
                ("rotary_dims", "rotary dims per head (partial rotary)"), ("rotary_interleaved", "rotary on interleaved pairs"),
                ("nope_layers", "layers without rotary (NoPE)"), ("qk_norm", "q/k norm"),
                ("norm_placement", "norm placement"), ("parallel_blocks", "parallel attention and MLP"),
                ("mlp_act", "MLP activation"), ("gated_mlp", "gated MLP"), ("attention_bias_on", "attention biases on"),
                ("learned_sinks", "learned attention sinks"), ("attention_windows", "sliding windows by layer"),
                ("experts_per_layer", "mixture-of-experts layout"))


def architecture_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Review 20c B2 (redone): between runs on two architectures, every fact of the manifests' "model" that differs
    (family, shape, rotary and NoPE layers, norms, MLP, biases, sinks, windows, experts), so a reader sees why their
    heads and sites are not one another's; [] where the facts agree or a side does not record them (older runs)."""
    if not a or not b:
        return []
    rows = []
    for key, what in ARCHITECTURE:
        x, y = a.get(key), b.get(key)
        if key not in a or key not in b:
            continue
        x, y = _fact_text(x), _fact_text(y)
        if x != y:
            rows.append((what, x, y))
    return rows


def _fact_text(value: Any) -> Any:
    """A fact as compare's settings line shows it: lists and tuples joined, an empty one as 'none', a dict as k=v."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_fact_text(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    return value


def _analyses_text(config: Mapping[str, Any]) -> str | None:
    """The analyses a run's report holds, in the manifest's order ("heads, patching"), None where not recorded."""
    names = config.get("analyses")
    return ", ".join(str(n) for n in names) if isinstance(names, (list, tuple)) and names else None


def _task_text(record: Mapping[str, Any]) -> str:
    return f"{record.get('task') or 'not recorded'} ({record.get('source') or 'source not recorded'})"


def _budget_text(record: Mapping[str, Any], idle: frozenset[str] = frozenset()) -> str:
    """The settings a run's budget changed, with the speed it was fitted to where recorded (review 10a A2: two runs
    of one command can differ here by the load at their start, not by any setting), less `idle` ones (settings of a
    part that ran in neither run: compare_run.idle_settings)."""
    changed = {k: v for k, v in (record.get("budget_changed") or {}).items() if k not in idle}
    text = ", ".join(setting_change(k, *v) if isinstance(v, (list, tuple)) and len(v) == 2 else f"{k} {v}"
                     for k, v in changed.items()) or "none"  # review 19b C2: what a dropped window means
    speed = record.get("budget_speed")
    if changed and isinstance(speed, Mapping):
        text += f" (fitted to the speed measured at the start of the run: {speed_text(speed)})"
    return text


def _finding_cell(run: Run, name: str) -> str:
    """One cell of the findings table (escaped): the finding, else why it is blank."""
    summary = run.summary(name)
    if summary is None:
        return f"<em>blank: {escape(run.why_blank(name))}</em>"
    text = finding(name, summary)
    return escape(text) if text else "<em>blank: its summary has none of the numbers this finding reads</em>"


def provenance_html(a: Run, b: Run, names: list[str]) -> str:
    """Both runs' provenance: per analysis its section provenance (task, source, n, sample, budget), then
    each run's model, seed, versions, commit and command (html_report._provenance)."""
    rows = []
    for name in names:
        cells = []
        for run in (a, b):
            record = run.provenance(name)
            lines = provenance_lines(record) if record is not None else [f"blank: {run.why_blank(name)}"]
            cells.append("<br>".join(escape(line) for line in lines))
        rows.append(f"<tr><th>{escape(name)}</th><td>{cells[0]}</td><td>{cells[1]}</td></tr>")
    infos = [_provenance(r.path) for r in (a, b)]
    for key in dict.fromkeys([*infos[0], *infos[1]]):
        rows.append(f"<tr><th>{escape(key)}</th>" + "".join(f"<td>{escape(i.get(key, ''))}</td>" for i in infos) + "</tr>")
    return ("<h2 id='provenance'>Provenance</h2><table class='side'><tr><th></th><th>A</th><th>B</th></tr>"
            + "".join(rows) + "</table>")


# review 13a B: the page fits the window (1,200 px); a long unbroken string (a --task-fields value, a path, a commit)
# wraps inside its cell instead of widening the table, A's and B's columns share the width, wide figures shrink
FIT_CSS = (".side{table-layout:fixed;width:100%}.side th:first-child{width:9em}.side td{vertical-align:top}"
           "td,th,li,p{overflow-wrap:anywhere}table{max-width:100%}img{max-width:100%;height:auto}")


def failed_notes(a: Run, b: Run, names: list[str]) -> list[str]:
    """Review 15d C2: an analysis with a result in neither run (failed in both, or failed in one and not run in the
    other) was named only in the findings table; the page's summary lists it under Not compared, with each run's
    reason ("heads: failed in both: RuntimeError: ..."; "patching: skipped in both: ..."; one reason said once where
    both runs give it, review 16v C3)."""
    notes = []
    for name in names:
        if a.summary(name) is not None or b.summary(name) is not None:
            continue
        why = [run.why_blank(name).rstrip(".") for run in (a, b)]
        kind = next((k for k in ("failed", "skipped") if all(w.startswith(k) for w in why)), None)
        if kind is not None:
            reasons = [w.removeprefix(kind).lstrip(":").strip() or "no reason recorded" for w in why]
            text = (f"{name}: {kind} in both: {reasons[0]}" if reasons[0] == reasons[1] else
                    f"{name}: {kind} in both: A: {reasons[0]}; B: {reasons[1]}")
        elif why[0] == why[1]:
            text = f"{name}: no result in either run, both: {why[0]}"
        else:
            text = f"{name}: no result in either run: A: {why[0]}; B: {why[1]}"
        notes.append(NOT_COMPARED + text + ".")
    return notes


def one_sided_notes(a: Run, b: Run, names: list[str]) -> list[str]:
    """Review 19v A1: the analyses with a result in one run only, one line per side and reason ("Only A has heads,
    position: B has no result there (not part of this run (not among its analyses))."), so the page says which
    sections a side lacks, and why, before each section's own note."""
    notes = []
    for side, run, other_side, other in (("A", a, "B", b), ("B", b, "A", a)):
        lacking: dict[str, list[str]] = {}
        for name in names:
            if run.summary(name) is not None and other.summary(name) is None:
                lacking.setdefault(other.why_blank(name).rstrip("."), []).append(name)
        notes += [NOT_COMPARED + f"Only {side} has {', '.join(found)}: {other_side} has no result there ({why})."
                  for why, found in lacking.items()]
    return notes


def _plain(note: str) -> str:
    return note.removeprefix(SAME).removeprefix(NOT_COMPARED).removeprefix(ROUNDING)


def report_links(a: Run, b: Run, page: Path | None) -> str:
    """A paragraph linking each run's report.html relative to the compare page's folder (review 13c C), or saying that
    a run has none; '' where the page's place is not known. Paths are percent-encoded, then escaped."""
    if page is None:
        return ""
    base = Path(os.path.abspath(page)).parent
    parts = []
    for side, run in zip(SIDES, (a, b)):
        report = run.path / "report.html"
        if report.is_file():
            href = quote(Path(os.path.relpath(os.path.abspath(report), base)).as_posix())
            parts.append(f"<a href='{escape(href)}'>{side}'s report ({escape(str(report))})</a>")
        else:
            parts.append(f"{side} has no report.html in {escape(str(run.path))}")
    return "<p class='reports'>Reports: " + " &middot; ".join(parts) + "</p>"


def compare_html(a: Run, b: Run, page: Path | None = None) -> str:
    """The page: links to both reports (relative to `page`, where the page will be written),
    settings that differ, the differences (each within or beyond noise where intervals are recorded),
    what is not compared and why (never among the differences), the findings side by side, the overlays and
    tables of the quantities compared, every figure of both reports A beside B, and both provenances."""
    names = list(dict.fromkeys([*((a.manifest.get("config") or {}).get("analyses") or []),
                                *((b.manifest.get("config") or {}).get("analyses") or [])]))
    notes: list[str] = []
    blocks = []
    for title, anchor, section in (("Head importance", "importance", importance_section),
                                   ("Pruning curves", "pruning", pruning_section),
                                   ("Position curves", "position", position_section),
                                   ("Top patching sites", "patching", patching_section)):
        body, found = section(a, b)
        notes += found
        if body:
            blocks.append(f"<h2 id='{anchor}'>{escape(title)}</h2>" + body
                          + "".join(f"<p class='finding'>{escape(_plain(n))}</p>" for n in found))
    notes += headline_notes(a, b)
    notes = one_sided_notes(a, b, names) + notes + failed_notes(a, b, names)
    figures, figure_notes = figures_section(a, b, names)
    notes += figure_notes
    differ = [n for n in notes if not n.startswith((SAME, NOT_COMPARED, ROUNDING))]
    rounded = [_plain(n) for n in sorted((n for n in notes if n.startswith(ROUNDING)), key=rounding_move, reverse=True)]
    refused = [_plain(n) for n in notes if n.startswith(NOT_COMPARED)]
    agreed = [_plain(n) for n in notes if n.startswith(SAME)]  # review 14b C1: listed, never dropped
    rows = "".join(f"<tr><th>{escape(name)}</th>" + "".join(f"<td>{_finding_cell(r, name)}</td>" for r in (a, b)) + "</tr>"
                   for name in names)
    head = (f"<tr><th></th><th>A: {escape(a.label_against(b))}<br><small>{escape(str(a.path))}</small></th>"
            f"<th>B: {escape(b.label_against(a))}<br><small>{escape(str(b.path))}</small></th></tr>")
    compared = differ or rounded or any(n.startswith(SAME) for n in notes)  # each section says a comparison it made
    differences = "".join(f"<li>{escape(n)}</li>" for n in differ) or (
        "<li>None beyond the rounding moves below.</li>" if rounded else
        "<li>No difference above the thresholds.</li>" if compared or not refused else
        "<li>Nothing could be compared: every quantity is listed under Not compared, and why (no difference was "
        "tested).</li>")
    if rounded:  # review 17b B1: after the differences, one compact group, its premise said once
        differences += (f"</ul><p class='rounding'>{escape(rounding_premise(a, b))}</p><ul class='rounding'>"
                        + "".join(f"<li>{escape(n)}</li>" for n in rounded))
    not_compared = "".join(f"<li>{escape(n)}</li>" for n in refused) or "<li>Nothing: every quantity above is compared.</li>"
    same = "".join(f"<li>{escape(n)}</li>" for n in agreed) or "<li>Nothing.</li>"
    settings = settings_notes(a, b, names)
    setting_html = ("<h2 id='settings'>Settings that differ</h2><p>Differences in the results below may come from "
                    "these as much as from the models.</p><ul>" + "".join(f"<li>{escape(n)}</li>" for n in settings)
                    + "</ul>") if settings else "<h2 id='settings'>Settings</h2><p>The runs share every recorded setting.</p>"
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>headscope compare</title>"
            f"<style>{CSS}{FIT_CSS}{FIGURE_CSS}</style></head><body>"
            f"<h1>headscope compare</h1><p>A: {escape(a.label_against(b))} &nbsp; B: {escape(b.label_against(a))}</p>"
            + report_links(a, b, page) + setting_html + f"<h2 id='differences'>Differences</h2><ul>{differences}</ul>"
            f"<h2 id='same'>Within noise or the same</h2><ul>{same}</ul>"
            f"<h2 id='not-compared'>Not compared, and why</h2><ul>{not_compared}</ul>"
            f"<h2 id='findings'>Findings side by side</h2><table class='side'>{head}{rows}</table>"
            + "".join(blocks) + figures + provenance_html(a, b, names) + "</body></html>")


def compare_reports(out_a: str | Path, out_b: str | Path, out: str | Path | None = None, *, force: bool = False) -> Path:
    """Write the comparison page of two output folders; returns its path (default ./compare.html). An
    `out` that does not end in .html (or .htm) is refused before anything is read or written."""
    from headscope.reports.plots import setup_style

    target = Path(out) if out is not None else Path("compare.html")
    if target.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--out {str(target)!r} does not end in .html: the page is HTML, which a browser shows as "
                          f"source under another name; pass e.g. --out {str(target.with_suffix('.html'))!r}.")
    a, b = Run(out_a), Run(out_b)
    if target.exists() and not force:
        raise OutputExistsError(f"{str(target)!r} exists; pass --force to overwrite it or --out another file.")
    setup_style()
    page = compare_html(a, b, target)
    try:
        return io.write_text(target, page)
    except OSError as err:
        raise OutputError(f"Could not write {str(target)!r}: {err.strerror or err}.") from None
