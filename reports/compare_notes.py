"""Counts in words and the headline notes of `headscope compare` beyond QUANTITIES that are not verdicts
(reports/compare_headlines.py): `n_words` (the n beside each difference, which compare, compare_top and compare_heads
read), kv's cache size (an exact count: the same, or a difference said to be the dtype's where it is) and the circuits
DLA top writer with its ties, judged by the writers' intervals (`dla_top`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.reports.compare_run import NOT_COMPARED, SAME, SIDES, _number
from headscope.reports.findings import ci_pair, ci_words

SIZE_LABEL = "kv cache size"


def _itemsize(dtype: Any) -> int | None:
    import torch

    t = getattr(torch, str(dtype or "").removeprefix("torch."), None)
    return int(t.itemsize) if isinstance(t, torch.dtype) else None


def _kv_size_note(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> list[str]:
    """Review 14b-v C2: the kv finding's first numbers, "The KV cache takes 1.5 KiB per token (float32), 192.0 KiB at full
    context", compared: an exact count (no sampling noise, no interval), the same or a difference, said to be the
    dtype's (a setting, not the model) where the byte counts differ exactly as the dtypes' sizes do."""
    from headscope.reports.kv_cache_words import _bytes

    per = [s.get("bytes_per_token") for s in (sa, sb)]
    if not any(_number(x) for x in per):
        return []
    if not all(_number(x) for x in per):
        return [NOT_COMPARED + f"{SIZE_LABEL}: not compared: only {'A' if _number(per[0]) else 'B'}'s report states it."]
    full = [s.get("bytes_at_n_ctx") for s in (sa, sb)]
    said = ", ".join(f"{side} {_bytes(p)} per token ({s.get('dtype') or 'dtype not recorded'})"
                     + (f", {_bytes(f)} at full context" if _number(f) else "")
                     + (f" (one MLA latent of {s['latent'][0]} + {s['latent'][1]} numbers a layer, as the model's "
                        f"cache holds it)" if s.get("latent") else "")  # review 15d B1: what the exact count counts
                     for side, s, p, f in zip(SIDES, (sa, sb), per, full))
    if per[0] == per[1] and (full[0] == full[1] or not all(_number(f) for f in full)):
        return [SAME + f"{SIZE_LABEL}: {said}: the same (a count of bytes, exact: no sampling noise)."]
    da, db = sa.get("dtype"), sb.get("dtype")
    ia, ib = _itemsize(da), _itemsize(db)
    if da != db and ia and ib and per[0] * ib == per[1] * ia:
        why = (f"the dtypes differ ({da}, {ia} bytes a number, against {db}, {ib}): a setting, not the model")
    else:
        why = "the caches' shapes differ (layers, KV heads, head size or context), a property of the models"
    return [f"{SIZE_LABEL}: {said}: an exact count (no sampling noise): {why}."]


def dla_top(s: Mapping[str, Any]) -> list[str]:
    """The writers the circuits finding names as writing the most (circuits_words._writers): the largest |mean| of
    dla_top_components and those tied with it within their per-example spread (dla_top_differences' `tied`); []
    where none is recorded."""
    top = {k: float(v) for k, v in (s.get("dla_top_components") or {}).items() if _number(v)}
    if not top:
        return []
    names = sorted(top, key=lambda k: -abs(top[k]))[:3]
    pairs = {(d.get("a"), d.get("b")): d.get("tied") for d in s.get("dla_top_differences") or []
             if isinstance(d, Mapping)}
    group = names[:1]
    for k in names[1:]:
        if not all(pairs.get((g, k)) is True for g in group):
            break
        group.append(k)
    return group


def _writer_words(s: Mapping[str, Any], k: str) -> str:
    e = (s.get("dla_top_intervals") or {}).get(k)
    mean = e.get("mean") if isinstance(e, Mapping) else (s.get("dla_top_components") or {}).get(k)
    ci = ci_pair(e.get("ci"), ordered=True) if isinstance(e, Mapping) else None
    return f"{k}" + (f" ({mean:+.3g}" + (f", {ci_words(ci, '.3g')}" if ci else "") + ")" if _number(mean) else "")


def _dla_top_note(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> list[str]:
    """Review 14b C1: the DLA writer each circuits finding names first (with its ties), compared: the same writers,
    a shared writer, or other writers, judged within each run as _kv_closest_note does: within noise where, in each
    run, the other run's top writer's 95% interval overlaps its own top writer's; not known without intervals."""
    ga, gb = dla_top(sa), dla_top(sb)
    if not (ga or gb):
        return []
    label = "circuits DLA top writer"
    if not (ga and gb):
        return [NOT_COMPARED + f"{label}: not compared: only {'A' if ga else 'B'}'s report names one."]
    said = "; ".join(f"{side} {' and '.join(_writer_words(s, k) for k in g)}" + (" (tied)" if len(g) > 1 else "")
                     for side, s, g in zip(SIDES, (sa, sb), (ga, gb)))
    n = _n_text(*(((s.get("dla_top_intervals") or {}).get(g[0]) or {}).get("n", s.get("n_examples"))
                  for s, g in ((sa, ga), (sb, gb))))
    if set(ga) == set(gb):
        return [SAME + f"{label}: the same writer{'s' * (len(ga) > 1)}: {said} ({n})."]
    if set(ga) & set(gb):
        shared = " and ".join(k for k in ga if k in gb)
        return [SAME + f"{label}: a shared top writer, {shared}, each run naming the others as tied with it within "
                f"their per-example spread: {said} ({n})."]

    def clear(s: Mapping[str, Any], mine: str, other: str) -> bool | None:
        iv = s.get("dla_top_intervals") or {}
        a, b = (ci_pair((iv.get(k) or {}).get("ci"), ordered=True) for k in (mine, other))
        return None if a is None or b is None else a[0] > b[1] or b[0] > a[1]

    apart = [clear(sa, ga[0], gb[0]), clear(sb, gb[0], ga[0])]
    if None in apart:
        return [NOT_COMPARED + f"{label}: not compared: {said} ({n}); an interval is missing: whether the writers "
                "differ beyond noise is not known."]
    if not any(apart):
        return [SAME + f"{label}: {said} ({n}): within noise: in each run the other run's top writer's 95% interval "
                "overlaps its own top writer's."]
    return [f"{label}: {said} ({n}): beyond noise: " + " and ".join(side for side, x in zip(SIDES, apart) if x)
            + "'s top writer's 95% interval clears the other run's top writer's in its own run."]


def n_words(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> str:
    """'n 16 each', or that the example counts differ, which changes the examples measured and the intervals."""
    return _n_text(sa.get("n_examples"), sb.get("n_examples"))


def _n_text(na: Any, nb: Any, unit: str = "examples", unit_b: str | None = None) -> str:
    unit_b = unit if unit_b is None else unit_b
    if unit != unit_b:  # e.g. integrated gradients over its converged examples on one side only
        na, nb = ("not recorded" if x is None else x for x in (na, nb))
        return f"n {na} {unit} vs {nb} {unit_b}: intervals of other widths"
    if na == nb:
        return "n not recorded" if na is None else f"n {na} {unit} each" if unit != "examples" else f"n {na} each"
    na, nb = ("not recorded" if x is None else x for x in (na, nb))
    why = (", a setting, not the model: other example sets, intervals of other widths"
           if unit in ("examples", "token positions") else
           ": intervals of other widths")
    return f"n differs: {na} vs {nb} {unit}{why}"
