"""How the kv finding says one holding row (reports/kv_words.py): percentages with the band's precision, a row's
change with its interval, per-example range and n, the rounding step of the model dtype, the full-cache value, the
answers kept; compare reads `SHORT_UNITS`, `_pc` and `_answers`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from headscope.analyses.core.chance import clear_of
from headscope.reports.circuits_words import FEW_ANSWERS
from headscope.reports.findings import _num, and_join

TOLERANCE = 0.01  # holding.py's band, for rows said without their summary's


def _digits(x: float, tol: float) -> int:
    """Decimals of a percentage: 2 within 0.1 points of the band's edge (review 9a C1: -1.04% printed -1.0% read as
    inside a 1% band it misses), else 1."""
    return 2 if abs(abs(100 * x) - 100 * tol) < 0.1 else 1


def _pc(x: float, tol: float = TOLERANCE) -> str:
    """'+1.4%'; under 0.05% two significant digits ('+0.015%', not '+0.0%' for a change that is not 0)."""
    if x != 0 and abs(100 * x) < 0.05:
        return f"{100 * x:+.2g}%"
    return f"{100 * x:+.{_digits(x, tol)}f}%"


def _share(x: float, tol: float = TOLERANCE) -> str:
    """A change's size or the share it keeps, unsigned: '1.04%' near the band's edge, '24.1%' elsewhere."""
    return f"{100 * abs(x):.{_digits(x, tol)}f}%"


SHORT_UNITS = {"logit_diff": "logits", "logprob": "nats", "accuracy": "(accuracy, 0-1)"}


def wide_base(row: Mapping[str, Any]) -> bool:
    """Review 15d B2: whether the full-cache mean a row's change is a share of is too uncertain for a percentage: its
    95% interval (holding's base_ci_low / base_ci_high) reaches 0 or spans a factor of 2 or more (False where an
    older summary records none)."""
    lo, hi = _num(row.get("base_ci_low")), _num(row.get("base_ci_high"))
    if lo is None or hi is None:
        return False
    return lo <= 0 <= hi or max(abs(lo), abs(hi)) >= 2 * min(abs(lo), abs(hi))


def _diff_band(row: Mapping[str, Any]) -> str:
    """'-1.40 logits (95% CI [-4.35, +1.56], per example -6.06 to +1.50, n = 6)': a row's mean change in the metric's
    units with its interval (the change's interval times its scale), for a row whose full-cache mean is wide_base."""
    scale, unit = float(row["scale"]), row.get("unit") or "in the metric's units"
    lo, hi = (_num(row.get(k)) for k in ("ci_low", "ci_high"))
    ends = [row["diff"]] + ([lo * scale, hi * scale] if lo is not None and hi is not None else [])
    top = max(abs(v) for v in ends)
    digits = max(0, 2 - math.floor(math.log10(top))) if top > 0 and math.isfinite(top) else 2
    inner = [f"95% CI [{ends[1]:+.{digits}f}, {ends[2]:+.{digits}f}]"] if len(ends) == 3 else []
    if _num(row.get("per_example_diff_low")) is not None:
        inner.append(_per_example(row))
    return f"{row['diff']:+.{digits}f} {unit} (" + ", ".join(inner + [f"n = {row['n_evicting']}"]) + ")"


def _band(row: Mapping[str, Any], tol: float = TOLERANCE) -> str:
    """'+4.5% (95% CI [+3.1%, +5.9%], per example -0.12 to +0.8 logits, n = 16)' from a holding row (two decimals
    near the band's edge). The per-example range is each prompt's policy - full in the metric's units (the row's
    "unit", _with_units), never a share of its own full-cache value (review 10b C2: that value can lie near or
    below 0); an older summary's per-example shares are left out. Where the full-cache mean is too uncertain for a share
    (wide_base) and the row has its units: _diff_band, in the metric's units alone."""
    if wide_base(row) and row.get("unit") and _num(row.get("scale")) is not None and _num(row.get("diff")) is not None:
        return _diff_band(row)
    inner = []
    if _num(row.get("ci_low")) is not None and _num(row.get("ci_high")) is not None:
        inner.append(f"95% CI [{_pc(row['ci_low'], tol)}, {_pc(row['ci_high'], tol)}]")
    if _num(row.get("per_example_diff_low")) is not None:
        unit = row.get("unit") or "in the metric's units"
        inner.append(f"{_per_example(row)} {unit}")
    return f"{_pc(row['change'], tol)}{row.get('of') or ''} (" + ", ".join(inner + [f"n = {row['n_evicting']}"]) + ")"


def _per_example(row: Mapping[str, Any]) -> str:
    """'per example -6.06 to +1.50', or 'per example -0.00267' where the two ends are one value (review 19v C3: n = 1
    printed '-0.00267 to -0.00267')."""
    lo, hi = float(row["per_example_diff_low"]), float(row["per_example_diff_high"])
    span = _span_units(lo, hi)
    return f"per example {span.split(' to ')[0] if lo == hi else span}"


def _span_units(lo: float, hi: float) -> str:
    """'-37.8 to +0.7': both ends with the decimals of 3 significant digits of the larger |end|."""
    top = max(abs(lo), abs(hi))
    digits = max(0, 2 - math.floor(math.log10(top))) if top > 0 and math.isfinite(top) else 2
    return f"{lo:+.{digits}f} to {hi:+.{digits}f}"


def _with_units(hold: Any, unit: str, of: str | None = None) -> Any:
    """A copy of holding_budgets' record with `unit` on every row that has a per-example range (for _band) and `of`,
    what its change is a share of (" of the span" where the record's basis is the span from chance: review 14b B2)."""
    if of is None:
        of = " of the span" if isinstance(hold, Mapping) and hold.get("basis") == "span" else ""
    if isinstance(hold, Mapping):
        out = {k: _with_units(v, unit, of) for k, v in hold.items()}
        if "per_example_diff_low" in out:
            out["unit"], out["of"] = unit, of
        return out
    if isinstance(hold, list):
        return [_with_units(v, unit, of) for v in hold]
    return hold


def _eps(name: str) -> float | None:
    """torch's machine epsilon of a floating dtype named as the summary records it ("bfloat16"), else None."""
    dtype = getattr(torch, name, None)
    return float(torch.finfo(dtype).eps) if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _rounding(s: Mapping[str, Any], bound: Any, end: str) -> str:
    """Review 9a C4: 'its upper end, +0.02%, lies within one bfloat16 rounding step of the full-cache metric, 0.62%:
    rounding alone can put it either side of 0' where a "reaches 0" bound is that close to 0, else ''. One step: the
    spacing of the model dtype's floats at the full-cache metric, relative to it."""
    full, b = _num(s.get("metric_unevicted")), _num(bound)
    eps = _eps(str(s.get("dtype") or "").removeprefix("torch."))
    if full is None or b is None or eps is None or full == 0:
        return ""
    spacing = eps * 2.0 ** math.floor(math.log2(abs(full)))  # the float spacing at |full|, in the metric's units
    step = spacing / abs(full)  # relative
    if abs(b) > step:
        return ""
    return (f"its {end} end, {100 * b:+.2f}%, lies within one {s['dtype']} rounding step of the full-cache mean, "
            f"{100 * step:.2g}% of it (the spacing of {s['dtype']} numbers at {abs(full):.3g}: {spacing:.3g} {_unit(s)}): "
            "rounding alone can put it either side of 0")


def _full_value(s: Mapping[str, Any], full: float) -> str:
    """'-1.03 (95% CI [-1.27, -0.783], mean over 16 examples)': the full-cache mean with its t interval over the
    examples (the summary's metric_unevicted_ci; review 14b B2/C4), or without it where none is recorded."""
    n, ci = s.get("n_examples"), s.get("metric_unevicted_ci")
    inner = []
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(v) is not None for v in ci):
        inner.append(f"95% CI [{ci[0]:.3g}, {ci[1]:.3g}]")
    if n:
        inner.append(f"mean over {n} examples")
    return f"{full:.3g}" + (f" ({', '.join(inner)})" if inner else "")


def _unit(s: Mapping[str, Any]) -> str:
    return SHORT_UNITS.get(str(s.get("metric")), "in the metric's units")


def _rounding_held(name: str, rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> str:
    """Review 12b A7: 'heavy hitters at budget 16: its 95% interval passes the band by 0.0045 logits, within one
    bfloat16 rounding step of the metric (0.077 logits), so it counts as within.' (holding.py's floor)."""
    unit = SHORT_UNITS.get(str(s.get("metric")), "in the metric's units")
    dtype = s.get("dtype") or "the model's dtype"
    parts = [f"{r['budget']} (by {r['rounding_miss']:.2g} {unit})" for r in rows]
    return (f"{name.capitalize()} at budget{'s' if len(rows) > 1 else ''} {and_join(parts)}: the 95% interval passes "
            f"the band by less than one {dtype} rounding step of the metric ({rows[0]['rounding_floor']:.2g} {unit}, "
            "at its largest full-cache value), a miss rounding alone can make: counted as within.")


def _coarse_why(row: Mapping[str, Any], s: Mapping[str, Any] | None = None) -> str:
    """Review 18b B1: 'its 95% CI passes the band by 0.036 logits, less than one bfloat16 rounding step of the metric
    (0.066 logits, 2.9 times the band there, 0.022): cannot tell at this precision' for a row holding.py marks
    rounding_coarse (a step too large against the band to decide), else ''."""
    step, miss, band = (_num(row.get(k)) for k in ("rounding_coarse", "rounding_miss", "band"))
    if step is None or miss is None:
        return ""
    unit = row.get("unit") or SHORT_UNITS.get(str((s or {}).get("metric")), "in the metric's units")
    dtype = (s or {}).get("dtype") or "the model dtype's"
    size = ""
    if band:
        size = (f", {step / band:.2g} times the band there, {band:.2g}" if step > band else
                f", {100 * step / band:.0f}% of the band there, {band:.2g}")
    eps = _eps(str(dtype).removeprefix("torch."))  # review 19v B2: the step at the largest value (analysis.py's
    largest = f"eps {eps:.2g} x {step / eps:.3g} = " if eps and step > eps * 1.0001 else ""  # noise_floor), not the mean's
    return (f"its 95% CI passes the band by {miss:.2g} {unit}, less than one {dtype} rounding step of the metric at its "
            f"largest full-cache value ({largest}{step:.2g} {unit}{size}): cannot tell at this precision")


def _coarse_note(name: str, rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> str:
    """Review 18b B1: the rows holding.py marks rounding_coarse that no clause states, one sentence each."""
    return " ".join(f"{name.capitalize()} at budget {r['budget']}: {_coarse_why(r, s)}." for r in rows)


def _few_words(rows: Sequence[Mapping[str, Any]], tol: float = TOLERANCE) -> str:
    """Review 18c A2: '; at budget 32 it evicts from one prompt only (-0.2%, per example ..., n = 1): too few to say,
    so it neither makes nor breaks the verdict' for holding's too_few rows (fewer than 2 prompts, no interval), else
    ''."""
    if not rows:
        return ""
    said = "; ".join(f"at budget {r['budget']} it evicts from " + ("one prompt only" if r.get("n_evicting") == 1
                                                                    else f"{r.get('n_evicting')} prompts only")
                     + f" ({_flat(r, tol)})" for r in rows)
    who = "it neither makes nor breaks" if len(rows) == 1 else "they neither make nor break"
    return f"; {said}: too few to say, so {who} the verdict"


def _flat(row: Mapping[str, Any], tol: float = TOLERANCE) -> str:
    """_band without its parentheses: '+1.4%, 95% CI [+0.1%, +2.7%], per example ..., n = 16'."""
    band = _band(row, tol)
    return band.replace(" (", ", ", 1)[:-1]


def _listed(rows: Sequence[Mapping[str, Any]], flat: bool = False, tol: float = TOLERANCE) -> str:
    """'at 8, <band>; at 16, <band>' for the first and last of `rows` (one row: its band alone when flat)."""
    form = _flat if flat else _band
    if flat and len(rows) == 1:
        return form(rows[0], tol)
    first, last = rows[0], rows[-1]
    return f"at {first['budget']}, {form(first, tol)}" + (f"; at {last['budget']}, {form(last, tol)}"
                                                         if last is not first else "")


def _how_sure(row: Mapping[str, Any], how: str, tol: float, s: Mapping[str, Any] | None = None,
              undecided: bool = False) -> str:
    """After a policy that does not hold: whether its largest evicting budget's 95% interval supports "more than
    the tolerance above/below" (chance.clear_of), or only a change, or none (with the bound that reaches 0 said to
    be within rounding where it is: _rounding); undecided (review 14bv B1): that whether it stays within the band
    there cannot be told, and where the interval covers the whole band, that too."""
    verdict = clear_of(row.get("ci_low"), row.get("ci_high"), tol)
    if verdict == "band" or _num(row.get("ci_low")) is None:
        return ""
    pct = f"{100 * tol:.0f}%"
    tell = f", so whether it stays within {pct} there cannot be told" if undecided else ""
    if verdict == "zero":
        return f"; its 95% CI reaches inside the {pct} band: {how} it, but not clearly by more than {pct}{tell}"
    end = ("upper", row.get("ci_high")) if how == "below" else ("lower", row.get("ci_low"))
    near = _rounding(s, end[1], end[0]) if s is not None else ""
    if row["ci_low"] < -tol and row["ci_high"] > tol and not near:  # review 15d C6: said once, short
        return f"; its 95% CI covers the whole +-{pct} band"
    return f"; its 95% CI reaches 0{f' ({near})' if near else ''}: not clearly {how} it at all{tell}"


def _kept(row: Mapping[str, Any], full: float, tol: float = TOLERANCE) -> str:
    """'keeps 98.8% of the full-cache value, ' where the full cache's mean is positive (a share reads
    right only there; 98.96% near the band's edge), else ''."""
    return f"keeps {_kept_share(row, tol)} of the full-cache value, " if full > 0 and not wide_base(row) else ""


def _kept_share(row: Mapping[str, Any], tol: float) -> str:
    return f"{100 * (1 + row['change']):.{_digits(row['change'], tol)}f}%"


def _answers(row: Mapping[str, Any], guess: bool = False) -> str:
    """'; 16/16 answers correct (full cache 16/16)' from a holding row with accuracy counts, else ''; with guess
    (a task of few answers, _guess), the count a constant guess of the commonest answer gets there too (review 9a
    C3: on a yes/no task 9/16 is the guess's)."""
    if row.get("correct") is None:
        return ""
    n = row["n_evicting"]
    also = (f"; a constant guess of the commonest answer {row['guess_correct']}/{n}"
            if guess and _num(row.get("guess_correct")) is not None else "")
    return f"; {row['correct']}/{n} answers correct (full cache {row['full_correct']}/{n}{also})"


def _guess(hold: Mapping[str, Any]) -> bool:
    """Whether the task has few distinct answers (at most FEW_ANSWERS, the lens's rule), so that a constant guess
    of the commonest answer is right often enough to be the count's reference (holding's constant_guess)."""
    g = hold.get("constant_guess")
    return isinstance(g, Mapping) and _num(g.get("n_answers")) is not None and g["n_answers"] <= FEW_ANSWERS
