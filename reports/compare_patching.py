"""Patching's position-free headlines for `headscope compare` (reports/compare.py's patching section; review 18d C4):
two numbers each patching finding states that name no position counted from the end, so they are compared even where
the runs patched different prompts (where compare leaves the end-aligned cells blank):
- the residual stream at each prompt's corrupted token, layer by layer (summary at_corrupted_token.sites, the finding's
  lead where that token's place from the end differs across prompts: reports/patching_aligned.py), each layer's share
  of its own run's clean-corrupted gap with its 95% interval;
- path patching's largest path in size (summary path_patching.top_paths, reports/patching_words._path_words), its
  share of the gap with its 95% interval.
Both are judged by the rule of the page's other rows: each layer (or path) within or beyond the two runs' 95%
intervals (compare_run.noise_verdict), or, for one model on the same examples in two dtypes (compare.RoundingPair),
|B - A| against the lower dtype's rounding step at the effect's size (compare_run.dtype_step).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.reports.compare_run import (
    NOT_COMPARED,
    SAME,
    SIDES,
    _number,
    dtype_step,
    layers_by_noise,
    noise_verdict,
    rounding_text,
)
from headscope.reports.patching_aligned import RESIDUAL_ORDER, _fine, _token_words
from headscope.reports.patching_sites import share, tied
from headscope.reports.patching_words import distinct_pair

Floor = "tuple[float, str] | None"  # compare.comparison_floor: the coarser run's rounding floor of the metric


def _aligned_rows(s: Mapping[str, Any]) -> dict[str, dict[int, Mapping[str, Any]]]:
    """{site type: {layer: record}} of a summary's at_corrupted_token.sites ({} where not recorded)."""
    info = s.get("at_corrupted_token")
    sites = info.get("sites") if isinstance(info, Mapping) else None
    out: dict[str, dict[int, Mapping[str, Any]]] = {}
    for kind, rows in (sites or {}).items():
        if isinstance(rows, list):
            got = {int(r["layer"]): r for r in rows if isinstance(r, Mapping) and _number(r.get("effect"))
                   and _number(r.get("layer"))}
            if got:
                out[kind] = got
    return out


def _said(value: float, ci: tuple | None, shown: str | None = None) -> str:
    """A share with its 95% CI, to 2 decimals (patching_aligned._fine); with `shown` (the value as a pair's
    distinct_pair prints it) that value and its CI to 3 significant figures."""
    if shown is None:
        return _fine(value) + (f" [{_fine(ci[0])}, {_fine(ci[1])}]" if ci else "")
    return shown + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")


def _n(rows: list[Mapping[str, Any]]) -> str:
    from headscope.reports.compare_notes import _n_text

    return _n_text(*(r.get("n") for r in rows), "prompts")


def corrupted_token_notes(sums: list[Mapping[str, Any]], gaps: list, floor: Any, rounding: Any) -> list[str]:
    """The residual stream at the corrupted token compared layer by layer (the finding's first residual site type
    both runs record, RESIDUAL_ORDER): each layer's share of its own run's gap, within noise in every layer (SAME),
    beyond noise in some (a difference naming them), or not compared where a layer has no interval; for one model in
    two dtypes (`rounding`) each layer's raw |B - A| against the rounding step at its size. [] where either run does
    not record it."""
    rows = [_aligned_rows(s) for s in sums]
    kind = next((k for k in RESIDUAL_ORDER if k in rows[0] and k in rows[1]), None)
    if kind is None:
        return []
    names = [_token_words(s["at_corrupted_token"])[1] for s in sums]
    where = names[0] if names[0] == names[1] else "the first position where the prompts differ"
    label = f"patching {kind} at {where} (aligned on each prompt's own, not counted from the end), per layer"
    ra, rb = rows[0][kind], rows[1][kind]
    if set(ra) != set(rb):
        return [NOT_COMPARED + f"{label}: not compared: the runs' layers differ (A {len(ra)}, B {len(rb)})."]
    layers = sorted(ra)
    n = _n([ra[layers[0]], rb[layers[0]]])
    if rounding is not None:  # one model, two dtypes: raw effects against the rounding step at their size
        moved = []
        for k in layers:
            ea, eb = float(ra[k]["effect"]), float(rb[k]["effect"])
            moved.append((k, ea, eb, *dtype_step(rounding.low, [ea, eb], floor)))
        listed = "; ".join(f"layer {k} A {ea:.3g}, B {eb:.3g}" for k, ea, eb, _, _ in moved)
        unit = rounding.unit
        beyond = [m for m in moved if abs(m[2] - m[1]) > m[3]]
        if beyond:
            k, ea, eb, step, words = max(beyond, key=lambda m: abs(m[2] - m[1]) - m[3])
            return [f"{label}: beyond {rounding.low}'s rounding at layer {k}: |B - A| = {abs(eb - ea):.3g}{unit}, more "
                    f"than its step there ({step:.3g}: {words}): the precision changes the computation here, not only "
                    f"its rounding; every layer: {listed}{unit} ({n})."]
        if all(ea == eb for _, ea, eb, _, _ in moved):
            return [SAME + f"{label}: the same in every layer in both dtypes ({rounding.dtypes}): {listed}{unit} ({n})."]
        k, ea, eb, step, words = max(moved, key=lambda m: abs(m[2] - m[1]))
        return [rounding_text(f"{label}: layer {k} moved most: A {ea:.3g}, B {eb:.3g}, |B - A| = {abs(eb - ea):.3g}"
                              f"{unit}, within {rounding.low}'s rounding step there ({step:.3g}: {words}), as every "
                              f"layer; every layer: {listed} ({n}).", ea, eb)]
    shares = []
    for k in layers:
        said = [share(r[k], gap, bool(s.get("normalized"))) for r, gap, s in zip((ra, rb), gaps, sums)]
        if any(x is None for x in said):
            return []
        (va, ia), (vb, ib) = said
        shares.append((f"layer {k} A {_said(va, ia)}, B {_said(vb, ib)}", va, vb, ia, ib))
    return layers_by_noise(shares, f"{label}, as a share of each run's clean-corrupted gap with its 95% CI", n,
                           lambda none: f"{label}: not compared: no interval in {none} ({n}): whether this is beyond "
                           "noise is not known.")


def _paths(s: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    p = s.get("path_patching")
    rows = p.get("top_paths") if isinstance(p, Mapping) else None
    out = [r for r in rows or [] if isinstance(r, Mapping) and _number(r.get("effect"))
           and isinstance(r.get("sender"), (list, tuple)) and len(r["sender"]) == 2]
    return sorted(out, key=lambda r: -abs(float(r["effect"])))


def _head(r: Mapping[str, Any]) -> str:
    to = f" -> {r['receiver']}" if r.get("receiver") not in (None, "logits") else ""
    return f"L{r['sender'][0]}H{r['sender'][1]}{to}"


def _key(r: Mapping[str, Any]) -> tuple:
    return tuple(r["sender"]), r.get("receiver")


def path_notes(sums: list[Mapping[str, Any]], gaps: list, floor: Any, rounding: Any) -> list[str]:
    """Path patching's largest path in size compared across the runs: the same head, its shares within or beyond
    the two 95% intervals (for one model in two dtypes, its raw |B - A| against the rounding step); different heads,
    not a difference where in each run its top path and the other run's are tied (each inside the other's 95%
    interval, patching_sites.tied), else a difference; not compared where a run has none, with why (not run, or
    every path's effect 0). [] where neither run patched paths."""
    records = [s.get("path_patching") for s in sums]
    if not any(isinstance(p, Mapping) for p in records):
        return []
    label = "path patching's largest path in size"
    paths = [_paths(s) for s in sums]
    why = []
    for side, p, rows in zip(SIDES, records, paths):
        if not isinstance(p, Mapping):
            why.append(f"{side} did not patch paths")
        elif isinstance(p.get("not_run"), str):
            why.append(f"{side}'s report says {p['not_run']}")
        elif not rows or float(rows[0]["effect"]) == 0:
            why.append(f"{side}'s report names no path (every path's effect is 0)" if rows else f"{side} records none")
    if why:
        return [NOT_COMPARED + f"{label}: not compared: " + "; ".join(why) + "."]
    tops = [rows[0] for rows in paths]
    norm = [bool(s.get("normalized")) for s in sums]
    said = [share(t, gap, nm) for t, gap, nm in zip(tops, gaps, norm)]
    shown = distinct_pair(said[0][0], said[1][0]) if all(said) else (None, None)  # review 19v C4: 0.0549 and 0.0570
    text = [f"{_head(t)} {_said(x[0], x[1], d)}" if x else f"{_head(t)} {float(t['effect']):+.3g}"  # read 0.05, 0.06
            for t, x, d in zip(tops, said, shown)]
    n = _n(tops)
    unit = " of its run's gap" if all(said) and all(gaps) else ""
    if _key(tops[0]) == _key(tops[1]):
        text = [x.removeprefix(_head(tops[0]) + " ") for x in text]
        if rounding is not None:
            ea, eb = (float(t["effect"]) for t in tops)
            step, words = dtype_step(rounding.low, [ea, eb], floor)
            if ea == eb:
                return [SAME + f"{label}: {_head(tops[0])} in both, the same in both dtypes ({rounding.dtypes}): "
                        f"{text[0]}{unit} ({n})."]
            if abs(eb - ea) <= step:
                return [rounding_text(f"{label} ({_head(tops[0])} in both): A {ea:.3g}, B {eb:.3g}, |B - A| = "
                                      f"{abs(eb - ea):.3g}{rounding.unit} ({n}); within {rounding.low}'s rounding step "
                                      f"here ({step:.3g}: {words}).", ea, eb)]
            return [f"{label}: {_head(tops[0])} in both (A {text[0]}, B {text[1]}{unit}; {n}); beyond rounding: |B - A| = "
                    f"{abs(eb - ea):.3g}{rounding.unit}, more than {rounding.low}'s step here ({step:.3g}: {words}): the "
                    "precision changes the computation here, not only its rounding."]
        if not all(said) or not all(x[1] for x in said):
            return [NOT_COMPARED + f"{label}: {_head(tops[0])} in both (A {text[0]}, B {text[1]}; {n}): its size not "
                    "compared: a run gives no interval, so whether the sizes differ beyond noise is not known."]
        verdict = noise_verdict(said[0][0], said[1][0], said[0][1], said[1][1])
        return [(SAME if verdict.startswith(" (within") else "") + f"{label}: {_head(tops[0])} in both (A {text[0]}, B "
                f"{text[1]}{unit}; {n}){verdict}"]
    others = [next((r for r in rows if _key(r) == _key(tops[1 - i])), None) for i, rows in enumerate(paths)]
    if all(others) and all(tied(t, o) for t, o in zip(tops, others)):
        return [SAME + f"{label}: A {text[0]}, B {text[1]}{unit} ({n}): not a difference: in each run the two heads' "
                "paths are tied, each inside the other's 95% interval, so which is the largest is not settled."]
    missing = [side for side, o in zip(SIDES, others) if o is None]
    held = (f"; {' and '.join(missing)}'s summary does not list the other run's top path among its kept paths"
            if missing else "; in a run the two are not tied (not each inside the other's 95% interval)")
    return [f"{label} differs: A {text[0]}, B {text[1]}{unit} ({n}){held}."]
