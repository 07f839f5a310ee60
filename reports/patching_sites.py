"""Which patching cells a finding can cite (reports/plots_patching.py's finding; compare's ties), and how the
findings name them (a head, a KV head as such, a position from the end, a share of the gap with its interval).

Patching the residual stream at the answer position (-1 from the end, where a last-position metric is
read) from a late layer on restores the whole clean-corrupted gap by construction: every later
computation at that position reads it, and only later attention from other positions goes around it.
Such a cell says that the information has arrived there, not where it enters or how it moves, so the
finding leads with the residual cell away from the answer position (where the information enters:
the prompts differ there) and names the cells that write it into the answer position, stating the
trivial ones once. Cells are (site type, top_sites record) pairs, largest |effect| first.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.reports.findings import _num, and_join, attention_kind, ci_pair

DEPTH = {"resid_pre": 0.0, "resid_mid": 0.5, "resid_post": 1.0}  # resid_post l is resid_pre l + 1: one state
ATTENTION = ("attn_out", "head_out_by_pos")  # what attention writes at one position
WHOLE, NEAR = 0.95, 0.8  # the whole gap: a share of at least WHOLE, or of NEAR with its 95% interval reaching 1
CITED = 0.05  # a cell under this share of the gap is not cited as where the information enters or moves


def share(cell: Mapping[str, Any], gap: float | None, normalized: bool) -> tuple[float, tuple | None] | None:
    """A cell's effect as a share of the clean-corrupted gap and its 95% interval (None: no gap to divide by)."""
    divisor = gap if gap else (1.0 if normalized else None)
    effect = _num(cell.get("effect"))
    if divisor is None or effect is None:
        return None
    return effect / divisor, share_span(cell, divisor)


def share_span(cell: Mapping[str, Any], gap: float) -> tuple[float, float] | None:
    """A cell's 95% interval in shares of the gap: its share_ci where the analysis recorded one (the ratio of means'
    own interval; review 16c B5: ci / gap tracked how the prompts' gaps differ, [0.26, 1.74] for a share of exactly
    1 on every prompt), else its ci over the gap (a normalised metric's ci is the share's; older summaries)."""
    own = ci_pair(cell.get("share_ci"))
    if own and gap:
        return tuple(sorted(own))
    ci = ci_pair(cell.get("ci"))
    return tuple(sorted((ci[0] / gap, ci[1] / gap))) if ci and gap else None


def depth(kind: str, cell: Mapping[str, Any]) -> float:
    """A residual cell's place in the stream: its layer, plus 0.5 after attention (resid_mid), 1 after the block."""
    return int(cell.get("layer") or 0) + DEPTH[kind]


def at_answer(cell: Mapping[str, Any]) -> bool:
    end = cell.get("from_end")
    return isinstance(end, int) and not isinstance(end, bool) and end == -1


def carries_whole(cell: Mapping[str, Any], gap: float | None, normalized: bool) -> bool:
    """Whether a cell moves about the whole gap: a share of WHOLE or more, or of NEAR with its interval reaching 1
    (in size: noising's shares are negative, -1 the whole gap destroyed)."""
    said = share(cell, gap, normalized)
    if said is None:
        return False
    value, ci = said
    if value < 0:
        value, ci = -value, None if ci is None else (-ci[1], -ci[0])
    return value >= WHOLE or (value >= NEAR and ci is not None and ci[0] <= 1.0 <= ci[1])


def _big(cell: Mapping[str, Any], gap: float | None, normalized: bool) -> bool:
    said = share(cell, gap, normalized)
    return said is not None and abs(said[0]) >= CITED  # without a gap to divide by, the old lead stays


def by_construction(cells: list, gap: float | None, normalized: bool) -> list:
    """The residual cells at the answer position that carry the whole gap, from the shallowest that does on,
    one per residual state, shallowest first ([] where none does or the cells name no position from the end)."""
    answer = {}
    for kind, cell in cells:
        if kind in DEPTH and at_answer(cell) and carries_whole(cell, gap, normalized):
            answer.setdefault(depth(kind, cell), (kind, cell))  # the first kind listed names a shared state
    return [answer[d] for d in sorted(answer)]


def entering(cells: list, gap: float | None, normalized: bool) -> tuple | None:
    """The residual cell of largest |effect| away from the answer position (its place from the end known), where
    the information sits before it is moved there; None where there is none or it is under CITED of the gap."""
    off = [(k, c) for k, c in cells if k in DEPTH and isinstance(c.get("from_end"), int) and not at_answer(c)]
    best = max(off, key=lambda kc: abs(kc[1]["effect"]), default=None)
    return best if best is not None and _big(best[1], gap, normalized) else None


def reaching(cells: list, whole: list, gap: float | None, normalized: bool) -> tuple | None:
    """The residual cell of largest |effect| at the answer position shallower than the first that carries the
    whole gap: how much has reached the answer position before it is trivially all there."""
    top = depth(*whole[0]) if whole else float("inf")
    here = [(k, c) for k, c in cells if k in DEPTH and at_answer(c) and depth(k, c) < top]
    best = max(here, key=lambda kc: abs(kc[1]["effect"]), default=None)
    return best if best is not None and _big(best[1], gap, normalized) else None


def writer(cells: list, gap: float | None, normalized: bool) -> tuple | None:
    """The attention cell (attn_out, a head by position) of largest |effect| at the answer position: what moves
    the information there from the positions where it entered."""
    here = [(k, c) for k, c in cells if k in ATTENTION and at_answer(c)]
    best = max(here, key=lambda kc: abs(kc[1]["effect"]), default=None)
    return best if best is not None and _big(best[1], gap, normalized) else None


def tied(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two cells of one run are within each other's 95% intervals (each effect inside the other's interval;
    a cell without an interval is judged by the other's alone; neither with one: not tied, nothing says so)."""
    ea, eb = _num(a.get("effect")), _num(b.get("effect"))
    if ea is None or eb is None:
        return False
    spans = []
    for cell, other in ((a, eb), (b, ea)):
        if ci := ci_pair(cell.get("ci")):
            spans.append(min(ci) <= other <= max(ci))
    return bool(spans) and all(spans)


def differ_offsets(s: Mapping[str, Any]) -> dict[int, int]:
    """{offset from the end: pairs} of every position where a clean prompt differs from its corrupted one
    (summary["at_corrupted_token"]["differ_from_end"]; {} where the summary does not record it)."""
    info = s.get("at_corrupted_token")
    places = info.get("differ_from_end") if isinstance(info, Mapping) else None
    if not isinstance(places, Mapping):
        return {}
    out = {}
    for offset, count in places.items():
        try:
            out[int(offset)] = int(count)
        except (TypeError, ValueError):
            continue
    return dict(sorted(out.items()))


def rebuilds_clean(s: Mapping[str, Any], kind: str, cell: Mapping[str, Any]) -> bool:
    """Whether patching this cell turns every corrupted run into its clean one (review 20a B3): the residual stream
    into layer 0 (the embeddings) at the one position where each pair differs, every pair differing there alone. Its
    share of the gap is then 1 by construction, whatever the model does."""
    if kind != "resid_pre" or _num(cell.get("layer")) != 0 or _num(cell.get("from_end")) is None:
        return False
    info = s.get("at_corrupted_token")
    span = info.get("positions_differ") if isinstance(info, Mapping) else None
    if not (isinstance(span, (list, tuple)) and len(span) == 2 and all(_num(x) == 1 for x in span)):
        return False
    places, n = differ_offsets(s), _num(info.get("n")) or _num(s.get("n_examples"))
    return list(places) == [int(cell["from_end"])] and n is not None and places[int(cell["from_end"])] == n


IDENTITY = ("; at layer 0 this is the embedding of the one token where each clean prompt differs from its corrupted "
            "one, so the patched run is the clean run and its share is 1 by construction, not a finding about the model")


SHOWN = 8  # differing positions named; the rest are counted


def differing_positions(s: Mapping[str, Any]) -> str | None:
    """'Each clean prompt differs from its corrupted one at 3 positions: -7, -4 and -1 from the end.', said once
    (with the pairs at each where they are not all); None where the summary does not record them."""
    places = differ_offsets(s)
    if not places:
        return None
    info = s["at_corrupted_token"]
    n = int(_num(info.get("n")) or max(places.values()))
    span = info.get("positions_differ")
    several = isinstance(span, (list, tuple)) and len(span) == 2 and all(_num(x) is not None for x in span)
    count = (f"{span[0]:.0f}" if span[0] == span[1] else f"{span[0]:.0f} to {span[1]:.0f}") if several else None
    noun = f"{count} position{'s' * (count != '1')}" if count else "these positions"
    every = all(k == n for k in places.values())
    # the most common first (by pairs; ties in position order), then cut after SHOWN: cutting by position hid -5,
    # where 4 of 7 pairs differ, in "and 1 more" (verify 11b N3)
    kept = sorted(places.items(), key=lambda p: -p[1])[:SHOWN]
    said = [f"{o}" if every else f"{o} ({k} of {n} pairs)" for o, k in kept]
    more = len(places) - SHOWN
    said = and_join(said + ([f"{more} more"] if more > 0 else [])) + " " + end_words(s)
    return f"Each clean prompt differs from its corrupted one at {noun}: {said}."


HALF = 0.5  # a column fewer than this share of the prompts reach is never ranked, tied with or cited (review 10a A3)


def thin(cell: Mapping[str, Any], total: Any) -> bool:
    """Whether fewer than HALF of the run's `total` prompts reach the cell's column (its n: under left padding a
    position far from the end is a real token in the longer prompts only; review 10a A3: one 64-token prompt's cell,
    1.18 of the mean gap because its own gap is larger, was ranked above averages over every prompt)."""
    n, total = _num(cell.get("n")), _num(total)
    return bool(total) and n is not None and n < HALF * total


def split_token(s: Mapping[str, Any]) -> bool:
    """Whether the corrupted token (each prompt's first position that differs) sits at different places from the end
    across prompts (summary["at_corrupted_token"]["from_end"]): then every end-aligned column averages it with other
    tokens, and the finding leads with the effect aligned on it."""
    info = s.get("at_corrupted_token")
    places = info.get("from_end") if isinstance(info, Mapping) else None
    return isinstance(places, Mapping) and len(places) > 1 and isinstance(info.get("sites"), Mapping)


def changed_there(s: Mapping[str, Any], offset: Any) -> int:
    """How many prompts differ from their corrupted prompt at `offset` from the end (0 where none, or unrecorded)."""
    places = differ_offsets(s) or {int(o): int(k) for o, k in ((s.get("at_corrupted_token") or {}).get("from_end")
                                                              or {}).items()}
    return places.get(offset, 0) if isinstance(offset, int) else 0


# ---- how the findings name a cell (patching_words, patching_agreement, patching_aligned; compare reads KV_SITES)
KV_SITES = ("k", "v")  # their head index is a KV head, which query heads share under grouped- or multi-query attention


def _head(kind: str, cell: Mapping[str, Any], s: Mapping[str, Any] | None = None) -> str:
    """A head by its name (L1H3), as every section names heads (the report links it to the explorer); a k or v cell's
    head is a KV head, never named as a query head (review 9b A3: "v at L0H0" was layer 0's one KV head, read by
    every query head): "layer 0's KV head 0 (shared by all 4 query heads: multi-query attention)", with the query
    heads that read it where the summary has the head counts (n_heads, n_kv_heads)."""
    layer, head = cell.get("layer"), cell["head"]
    heads, kv = (_num((s or {}).get(k)) for k in ("n_heads", "n_kv_heads"))
    if kind not in KV_SITES or (heads and kv and kv == heads):
        return f"L{layer}H{head}"
    if (sharing := attention_kind(heads, kv)) is None:
        return f"layer {layer}'s KV head {head}"
    per = int(heads) // int(kv)
    if kv == 1:
        return f"layer {layer}'s KV head {head} (shared by all {heads:.0f} query heads: {sharing} attention)"
    return f"layer {layer}'s KV head {head} (read by query heads {head * per}-{head * per + per - 1}: {sharing} attention)"


def reaches_zero_by_rounding(cell: Mapping[str, Any], floor: float | None) -> bool:
    """Whether a cell's interval excludes 0 only by an end within the rounding floor of 0 (review 14c B3), where its
    effect is not itself within the floor: _effect_ci then says it reaches 0 within rounding."""
    ci, effect = ci_pair(cell.get("ci")), _num(cell.get("effect"))
    if not floor or ci is None or (effect is not None and (abs(effect) <= floor or cell.get("within_rounding"))):
        return False
    return min(ci) * max(ci) > 0 and abs(min(ci, key=abs)) < floor


def _effect_ci(cell: Mapping[str, Any], gap: float | None, floor: float | None = None, unit: str = "") -> str:
    """', 95% CI [lo, hi] over n examples' of a top site's effect (its recorded t interval over the
    per-example effects; where the finding states a share of the gap, the share's own interval: share_span); ''
    without one.
    floor (the summary's rounding floor, in the effect's raw units `unit`): an interval that excludes 0 only by
    an end within the floor of 0 is said to reach 0 within rounding (review 14c B3: [+0.025, +10.6] logits under
    a floor of 0.07 read "[0.00, 0.60]", as clear of 0); an effect within the floor is said to be, no interval
    given (review 19c B1: bfloat16 q/k cells of 0.01 logits with intervals clear of 0)."""
    ci, n = ci_pair(cell.get("ci")), _num(cell.get("n"))
    effect = _num(cell.get("effect"))
    if floor and effect is not None and (abs(effect) <= floor or cell.get("within_rounding")):
        # review 19c B1: an effect within the rounding floor is no evidence, whatever its interval over the rows
        return (f", within the rounding floor of 0 ({effect:+.2g}{' ' + unit if unit else ''} against {floor:.2g}"
                + (f", {n:.0f} examples" if n else "") + "): not told apart from 0")
    if ci is None:
        return f", n = {n:.0f} examples" if n else ""
    lo, hi = share_span(cell, gap) if gap else (ci[0], ci[1])
    said = f", 95% CI [{lo:.2f}, {hi:.2f}] over {n:.0f} examples" if n else f", 95% CI [{lo:.2f}, {hi:.2f}]"
    near = min(ci, key=abs)  # the raw end nearest 0
    if reaches_zero_by_rounding(cell, floor):
        said += (f", which reaches 0 within rounding: its end nearest 0, {near:+.2g}{' ' + unit if unit else ''}, lies "
                 f"within the rounding floor ({floor:.2g}{' ' + unit if unit else ''})")
    return said


def end_words(s: Mapping[str, Any] | None) -> str:
    """What a cell's place counts from: "from the prompt's end" where answers have several tokens (summary
    answer_pieces: -1 is each prompt's last token, not the row's last, an answer piece; review 12c), else "from the
    end"."""
    info = s.get("answer_pieces") if isinstance(s, Mapping) else None
    return "from the prompt's end" if isinstance(info, Mapping) and _num(info.get("rows")) else "from the end"


def _where(kind: str, cell: Mapping[str, Any], s: Mapping[str, Any] | None = None) -> str:
    """'<kind> at layer l, position -k from the end' or '<kind> at LlHh' (a rank check's cell; a KV head: _head)."""
    head, end = cell.get("head"), cell.get("from_end")
    at = f"layer {cell.get('layer')}" if head is None else _head(kind, cell, s)
    return f"{kind} at {at}" + (f", position {end} {end_words(s)}" if isinstance(end, int) else "")


def _size(x: float, gap: float | None) -> str:
    return f"{x / gap:.2f} of the gap" if gap else f"{x:.3g}"


def _reach(s: Mapping[str, Any] | None, kind: str, cell: Mapping[str, Any]) -> str:
    """', a column only 1 of 8 prompts reach' for a cell of a column fewer than half the prompts reach (its n from
    top_sites; review 10a A3), '' otherwise."""
    rows = ((s or {}).get("top_sites") or {}).get(kind) or []
    same = next((c for c in rows if all(c.get(k) == cell.get(k) for k in ("layer", "head", "pos"))), None)
    if same is None or not thin(same, (s or {}).get("n_examples")):
        return ""
    return f", a column only {_num(same['n']):.0f} of {_num(s['n_examples']):.0f} prompts reach"
