"""Patching sites aligned on the differing positions, for `headscope compare` where the runs patched different prompts
(another seed or example count) of one task: review 13a C4 refused every positional site although both runs' own
findings align on the same differing word (the job word, 4 positions before the end in every prompt of both) and
both restore 1.00 of the gap there. A position counted from the end names another token in other prompts, but the
k-th position where clean and corrupted differ is the same word of the task's template when, in both runs, the
differing positions sit at the same places from the end in every prompt (`same_slots`); then each site type's top
cell aligned on that position (the summary's at_corrupted_token, analyses/patching) is set against the other run's.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.reports.compare_run import SAME, SIDES, _number
from headscope.reports.findings import ordinal


def _aligned(s: Mapping[str, Any]) -> Mapping[str, Any]:
    entry = s.get("at_corrupted_token")
    return entry if isinstance(entry, Mapping) else {}


def same_slots(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> str | None:
    """'' where both runs' prompts differ from their corrupted ones at the same places from the end, every prompt of
    each (differ_from_end: {offset: prompts}), so the k-th differing position is one word of the template in both;
    else why not (None where a run records no aligned results)."""
    entries = [_aligned(s) for s in (sa, sb)]
    if not all(e.get("orders") and isinstance(e.get("differ_from_end"), Mapping) for e in entries):
        return None
    for side, e in zip(SIDES, entries):
        n = e.get("n")
        if not _number(n) or any(k != n for k in e["differ_from_end"].values()):
            return f"{side}'s prompts differ from their corrupted ones at other places from the end"
    if set(entries[0]["differ_from_end"]) != set(entries[1]["differ_from_end"]):
        offsets = [", ".join(sorted(e["differ_from_end"], key=int)) for e in entries]
        return f"the differing positions sit at other places from the end (A {offsets[0]}, B {offsets[1]})"
    return ""


def _top(cells: list) -> Mapping[str, Any] | None:
    cells = [c for c in cells if isinstance(c, Mapping) and _number(c.get("effect"))]
    return max(cells, key=lambda c: abs(float(c["effect"]))) if cells else None


def aligned_pairs(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> list[tuple[str, str, Mapping, Mapping]]:
    """[(site type, what the row is aligned on, A's top cell, B's top cell)] for every differing position (order) and
    site type both runs record; [] unless same_slots."""
    if same_slots(sa, sb) != "":
        return []
    orders = [{o.get("order"): o for o in _aligned(s)["orders"] if isinstance(o, Mapping)} for s in (sa, sb)]
    many = len(_aligned(sa)["differ_from_end"]) > 1
    out = []
    for order in sorted(k for k in orders[0] if k in orders[1] and _number(k)):
        oa, ob = orders[0][order], orders[1][order]
        ends = [list((o.get("from_end") or {}).keys()) for o in (oa, ob)]
        if not (len(ends[0]) == len(ends[1]) == 1 and ends[0] == ends[1]):
            continue
        where = (f"the {ordinal(int(order))} differing position" if many else "the differing position") + \
            f" ({ends[0][0]} from the end in every prompt of both)"
        sites = [o.get("sites") or {} for o in (oa, ob)]
        for kind in [k for k in sites[0] if k in sites[1]]:
            ca, cb = _top(sites[0][kind]), _top(sites[1][kind])
            if ca is not None and cb is not None:
                out.append((kind, where, ca, cb))
    return out


def aligned_note(kind: str, where: str, pair: tuple[Mapping, Mapping], texts: tuple[str, str], under: bool) -> str:
    """A row's line: the same top layer (SAME), or the layers that differ; cells both under the rounding floor are
    no site in either run (SAME)."""
    la, lb = (c.get("layer") for c in pair)
    head = f"Top {kind} layer aligned on {where}"
    if under:
        return SAME + f"{head}: no site in either run, both under the rounding floor (A {texts[0]}; B {texts[1]})."
    if la == lb:
        return SAME + f"{head}: layer {la} in both (A {texts[0]}; B {texts[1]})."
    return f"{head} differs: A layer {la} ({texts[0]}), B layer {lb} ({texts[1]})."
