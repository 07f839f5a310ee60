"""Top heads for `headscope compare`: every importance method's top heads that both heads summaries list
(`top_heads_<method>`), compared as a set and in order, with the ties each summary records
(`tied_top_heads_<method>`, `tied_top_next_<method>`: analyses/heads/analysis.py `numerical_checks`) taken
into account rather than refusing the comparison: a tie at the edge of the top k (the k-th head ties with the
(k+1)-th) leaves only the k-th place undecided, and heads tied inside the top k are compared as a tied group,
not as an order (review 8b A4). Heads that swap places while their importances lie within each other's noise in
either run (their 95% t intervals from results.csv's importance_se overlap) are said as such, not as another
order (reviews 10a C2, 10b C5); where a run keeps each example's value (importance_examples.csv: an ablation drop,
or the example's own |dL/d gate| for gradient importance), the swap is judged by the paired difference's own 95%
interval over the same examples (review 12b C3). Only a report that does not rank its heads at all (at chance, or
importance that is rounding) refuses the method.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from headscope.analyses.core.chance import mean_interval, t_quantile
from headscope.reports.compare_notes import n_words
from headscope.reports.compare_run import (
    NOT_COMPARED,
    SAME,
    SIDES,
    Run,
    dtype_of,
    models_differ,
    precision_only,
    tasks_differ,
)
from headscope.reports.findings import and_join, ordinal
from headscope.reports.heads_words import FINDING_METHOD_WORDS

TOP_K = 5  # older reports without top_heads_<method>: the top 5 of results.csv, as the heads analysis lists


def refuses_to_rank(run: Run, method: str) -> str | None:
    """Why run's own heads finding does not rank its heads by `method` (reports/heads_words.py), or None: the
    model at chance on the task, or importance that is rounding (degenerate_<method>). Ties among the top heads
    do not refuse: they are compared as ties (top_heads_notes)."""
    s = run.summary("heads") or {}
    chance = s.get("chance")
    if isinstance(chance, Mapping) and chance.get("at_chance") is True:
        return "is at chance on its task" if chance.get("below_chance") is not True else "is below chance on its task"
    base = s.get("baseline_metric")
    if "chance" not in s and s.get("metric") == "logit_diff" and isinstance(base, (int, float)) and abs(base) < 0.1:
        return f"is at chance on its task (logit difference {base:.3g}, near 0)"
    if s.get(f"degenerate_{method}"):  # review 15a B2: a gradient's values are measured, its predicted changes are not
        return (f"has {method} importance whose predicted loss changes are under the rounding floor" if method == "gradient"
                else f"has {method} importance that is rounding, not a measurement")
    return None


def top_lists(run: Run) -> dict[str, list[str]]:
    """{method: its top heads, highest first}: the heads summary's top_heads_<method> (empty where its report does
    not rank by that method); older summaries without any: the TOP_K highest of heads/results.csv per method."""
    s = run.summary("heads") or {}
    listed = {k.removeprefix("top_heads_"): [str(h) for h in v] for k, v in s.items()
              if k.startswith("top_heads_") and isinstance(v, list)}
    if listed:
        return listed
    df = run.table("heads", "results")
    if df is None or not {"method", "layer", "head"} <= set(df.columns):
        return {}
    key = "rank" if "rank" in df.columns else "importance" if "importance" in df.columns else None
    if key is None:
        return {}
    out = {}
    for method, g in df.groupby("method", sort=False):
        g = g.sort_values(key, ascending=key == "rank", kind="stable").head(TOP_K)
        out[str(method)] = [str(n) for n in g["head_name"]] if "head_name" in g.columns else \
            [f"L{int(l)}H{int(h)}" for l, h in zip(g["layer"], g["head"])]
    return out


@dataclass(frozen=True, kw_only=True)
class Ties:
    """The ties one summary records among its top k heads: `groups`, runs of positions (from 0) whose order is
    arbitrary (the summary's tied_top_groups_<method>, which may share a head; an older summary's tied_top_heads_<method>
    at neighbouring places merged: it names the tied heads, not their partners, so the merge errs towards calling an
    order arbitrary); `edge`, the group that holds the k-th place
    when it ties with the (k+1)-th, whose membership of the top k is then arbitrary, and that head's name (`next`,
    tied_top_next_<method>; None where an older summary names no partner: a lone tied k-th head can only tie with
    the next)."""

    groups: tuple[tuple[int, ...], ...]
    edge: tuple[int, ...] | None
    next: str | None


def ties(s: Mapping[str, Any], method: str, top: list[str]) -> Ties:
    tied = sorted(top.index(str(h)) for h in s.get(f"tied_top_heads_{method}") or [] if str(h) in top)
    groups: list[list[int]] = []
    runs = s.get(f"tied_top_groups_{method}")
    if isinstance(runs, list) and runs and all(isinstance(g, list) for g in runs):
        # the summary's own runs (review 14c A1: ties do not chain, so two runs may share a head), in the top k
        groups = [g for g in ([top.index(str(h)) for h in run if str(h) in top] for run in runs) if g]
    for i in tied if not groups else ():
        if groups and groups[-1][-1] == i - 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    nxt = s.get(f"tied_top_next_{method}")
    last = groups[-1] if groups and groups[-1][-1] == len(top) - 1 else None
    edge = tuple(last) if last is not None and (nxt or len(last) == 1) else None
    return Ties(groups=tuple(tuple(g) for g in groups), edge=edge, next=str(nxt) if nxt else None)


def _places(positions: tuple[int, ...]) -> str:
    return and_join([ordinal(i + 1) for i in positions])


def _tie_words(side: str, top: list[str], t: Ties, other: list[str]) -> list[str]:
    """Each recorded tie of one side in words: the edge ("B's 5th, L1H0, ties with its 6th, L2H1, within rounding,
    so B's 5th place is not decided") and the groups inside the top k ("A's 2nd and 3rd, L0H3 and L0H0, tie within
    rounding, so their order is arbitrary")."""
    out = []
    for g in t.groups:
        heads = and_join([top[i] for i in g])
        if g == t.edge:
            k1 = ordinal(len(top) + 1)
            partner = (f"its {k1}, {t.next}" + (f" (the other run's {ordinal(other.index(t.next) + 1)})"
                                                  if t.next in other else "")
                       if t.next else f"its {k1} (not named in its summary)")
            verb = "ties" if len(g) == 1 else "tie"
            out.append(f"{side}'s {_places(g)}, {heads}, {verb} with {partner}, within rounding, so {side}'s "
                       f"{_places(g)} place{'s are' if len(g) > 1 else ' is'} not decided")
        elif len(g) > 1:
            out.append(f"{side}'s {_places(g)}, {heads}, tie within rounding, so their order is arbitrary")
        else:  # a lone tied head inside the top k: its partner is not recorded
            out.append(f"{side}'s {_places(g)}, {heads}, ties within rounding with a neighbour, so its place is arbitrary")
    return out


def _untied_swaps(lists: list[list[str]], tie: list[Ties]) -> tuple[bool, list[tuple[str, str]]]:
    """(whether the heads both lists hold come in the same order, the pairs they order differently that lie in no
    tied group of A or of B, each in A's order)."""
    shared = [h for h in lists[0] if h in lists[1]]
    pos = [{h: i for i, h in enumerate(lst)} for lst in lists]
    group = [[{top[i] for i in g} for g in t.groups] for top, t in zip(lists, tie)]  # runs may share a head
    swapped = [(x, y) for i, x in enumerate(shared) for y in shared[i + 1:] if pos[1][x] > pos[1][y]]
    untied = [(x, y) for x, y in swapped if not any({x, y} <= g for side in group for g in side)]
    return not swapped, untied


def importances(run: Run, method: str) -> dict[str, tuple[float, float]]:
    """{head name: (importance, its standard error over examples)} of one method from heads/results.csv (the raw
    importance the findings rank by, importance_se); {} where the table has no standard errors."""
    df = run.table("heads", "results")
    if df is None or not {"method", "layer", "head", "importance", "importance_se"} <= set(df.columns):
        return {}
    g = df[df["method"].astype(str) == method]
    names = g["head_name"] if "head_name" in g.columns else [f"L{int(l)}H{int(h)}" for l, h in zip(g["layer"], g["head"])]
    return {str(n): (float(v), float(e)) for n, v, e in zip(names, g["importance"], g["importance_se"])
            if np.isfinite(v) and np.isfinite(e)}


def _close_in(imp: Mapping[str, tuple[float, float]], n: Any, x: str, y: str) -> tuple[float, float, float] | None:
    """(gap, se of x, se of y) where x's and y's importances lie within each other's noise in one run: their 95% t
    intervals over n examples overlap, |gap| <= t (se_x + se_y), as compare's noise verdict judges A against B
    (compare_run.noise_verdict); None otherwise or without standard errors. A marginal test: used only where the
    run keeps no per-example values of the method (`_paired_in`)."""
    if x not in imp or y not in imp or not isinstance(n, int) or n < 2:
        return None
    (vx, sx), (vy, sy) = imp[x], imp[y]
    gap = abs(vx - vy)
    return (gap, sx, sy) if gap <= float(t_quantile(n)) * (sx + sy) else None


def _paired_in(run: Run, method: str, x: str, y: str) -> tuple[float, list[float], int] | None:
    """(mean of x - y, its 95% t interval, n) over the examples both heads were measured on, from the run's
    heads/importance_examples.csv (each example's ablation drop or |dL/d gate|); None where the run has no such
    values for both (older runs) or fewer than 2 examples (review 12b C3: the swap within a run is a paired
    question, the same examples)."""
    df = run.table("heads", "importance_examples")
    if df is None or not {"method", "head_name", "example", "effect"} <= set(df.columns):
        return None
    g = df[df["method"].astype(str) == method]
    a = g[g["head_name"] == x].set_index("example")["effect"]
    b = g[g["head_name"] == y].set_index("example")["effect"]
    d = (a - b).dropna()  # [n] aligned on the example
    ci = mean_interval(d.to_numpy()) if len(a) and len(b) else None
    return None if ci is None else (float(d.mean()), ci, int(len(d)))


def _swap_close(run: Run, imp: Mapping[str, tuple[float, float]], n: Any, method: str, x: str, y: str) -> str | None:
    """Why x and y lie within each other's noise in one run, in words, or None where they do not: by the paired
    difference's 95% interval (it reaches 0) where the run keeps per-example values, else by the overlap of the
    two marginal intervals, said to be that."""
    paired = _paired_in(run, method, x, y)
    if paired is not None:
        diff, (lo, hi), k = paired
        if lo > 0 or hi < 0:
            return None
        return f"{x} - {y} = {diff:+.2g}, paired 95% CI [{lo:+.2g}, {hi:+.2g}] over {k} examples, which reaches 0"
    close = _close_in(imp, n, x, y)
    if close is None:
        return None
    gap, sx, sy = close
    return (f"{gap:.2g} apart, SEs {sx:.2g} and {sy:.2g}; their 95% intervals overlap: marginal intervals, not a "
            f"paired test, as the run keeps no per-example {method} values")


def _noise_swaps(pairs: list[tuple[str, str]], runs: tuple[Run, Run], method: str,
                 sums: list[Mapping[str, Any]]) -> str | None:
    """The swapped pairs in words where each pair's heads lie within each other's noise in A or in B, the run named
    whose order is within noise (`_swap_close`: "A: 0.0032 apart, SEs 0.054 and 0.059; their 95% intervals
    overlap: marginal intervals, ..." or "A: L0H2 - L0H3 = +0.16, paired 95% CI [...]"); None unless every pair is."""
    imps = [importances(r, method) for r in runs]
    said = []
    for x, y in pairs:
        close = next(((side, c) for side, run, imp, s in zip(SIDES, runs, imps, sums)
                      if (c := _swap_close(run, imp, s.get("n_examples"), method, x, y)) is not None), None)
        if close is None:
            return None
        side, why = close
        said.append((x, y, f"{side}: {why}"))
    if len(said) == 1:
        x, y, why = said[0]
        return f"{x} and {y} swap places, within each other's noise ({why})"
    return ("the heads that swap places lie within each other's noise: "
            + ", ".join(f"{x} / {y} ({why})" for x, y, why in said))


def _edge_explains(lists: list[list[str]], tie: list[Ties]) -> bool:
    """Whether every head only one list holds is one whose membership is arbitrary: in its own list's edge group,
    or the (k+1)-th head the other list's edge ties with."""
    for mine, theirs, t_mine, t_theirs in ((lists[0], lists[1], tie[0], tie[1]), (lists[1], lists[0], tie[1], tie[0])):
        undecided = {mine[i] for i in t_mine.edge or ()}
        for h in set(mine) - set(theirs):
            if h not in undecided and h != t_theirs.next:
                return False
    return True


def settled_words(method: str, lists: list[list[str]], tie: list[Ties], sums: list[Mapping[str, Any]],
                  runs: tuple[Run, Run]) -> list[str]:
    """Where A and B are one model at two precisions (compare_run.precision_only), how the higher-precision run orders
    each group of heads the lower one leaves tied (its places, and the (k+1)-th head an edge tie runs to), by its own
    importances (results.csv) and whether that is the lower run's listed order (review 11b A7: bfloat16's 2nd-5th
    "not decided" while float32, beside it, ordered them the same way within 0.001); a group the higher run also
    records as tied is said to stay undecided. [] otherwise."""
    sides = precision_only(*runs)
    if sides is None:
        return []
    hi, lo = sides
    imp = importances(runs[hi], method)
    tied_hi = {str(h) for h in sums[hi].get(f"tied_top_heads_{method}") or []}
    out = []
    for g in tie[lo].groups:
        heads = [lists[lo][i] for i in g] + ([tie[lo].next] if g == tie[lo].edge and tie[lo].next else [])
        if len(heads) < 2 or not all(h in imp for h in heads):
            continue
        where = f"{SIDES[lo]}'s tied {_places(g)}" + (f" and {tie[lo].next}" if len(heads) > len(g) else "")
        if len(tied_hi & set(heads)) > 1:
            out.append(f"{SIDES[hi]} ({dtype_of(runs[hi])}) also records {and_join(sorted(tied_hi & set(heads)))} as "
                       f"tied, so {where} stay undecided")
            continue
        order = sorted(heads, key=lambda h: -imp[h][0])
        same = "the order " + SIDES[lo] + " lists" if order == heads else "another order than " + SIDES[lo] + " lists"
        out.append(f"{SIDES[hi]}, at {dtype_of(runs[hi])}, orders {where}: "
                   + ", ".join(f"{h} ({imp[h][0]:.3g})" for h in order)
                   + f", {same}; the tie is {dtype_of(runs[lo])}'s rounding, not the model's")
    return out


def _edge_noise(method: str, lists: list[list[str]], sums: list[Mapping[str, Any]],
                runs: tuple[Run, Run]) -> tuple[str, bool]:
    """Where the top-k sets differ, whether each head only one list holds lies within the other run's noise of that
    run's k-th head (review 13c C5: "4 of the top 5 are shared" with A's 4th and 5th and B's 5th at 0.63-0.78 and no
    interval said), in words, by the same test as a swap (`_swap_close`: the paired difference over the examples
    where the run keeps them, else the marginal intervals); ('', False) where a run keeps no standard errors.
    The flag: every such head is within noise."""
    said, within = [], True
    for side, run, mine, other, s in zip(SIDES, runs, lists, lists[::-1], sums):
        imp = importances(run, method)
        kth = mine[-1]
        for h in [h for h in other if h not in mine]:
            if h not in imp or kth not in imp:
                return "", False
            close = _swap_close(run, imp, s.get("n_examples"), method, kth, h)
            where = f"in {side}, {h} (outside {side}'s top {len(mine)}, {imp[h][0]:.3g}) and its {ordinal(len(mine))}, " \
                    f"{kth} ({imp[kth][0]:.3g})"
            if close is None:
                within = False
                said.append(f"{where} are not within each other's noise")
            else:
                said.append(f"{where} are within each other's noise ({close})")
    return "; ".join(said), within


def _top_note(method: str, lists: list[list[str]], sums: list[Mapping[str, Any]], runs: tuple[Run, Run]) -> str:
    tie = [ties(s, method, lst) for s, lst in zip(sums, lists)]
    said = [w for side, lst, t, other in zip(SIDES, lists, tie, lists[::-1]) for w in _tie_words(side, lst, t, other)]
    said += settled_words(method, lists, tie, sums, runs)
    same_order, untied = _untied_swaps(lists, tie)
    noise = _noise_swaps(untied, runs, method, sums) if untied else ""
    within = not untied or noise is not None  # every swap inside a rounding tie or within the heads' noise
    swaps = f"; {noise}" if noise else ""
    k = len(lists[0]) if len(lists[0]) == len(lists[1]) else None
    top = f"top {k}" if k else f"top {len(lists[0])} and {len(lists[1])}"
    both = f"A {', '.join(lists[0])}; B {', '.join(lists[1])}"
    if set(lists[0]) == set(lists[1]):
        agree = same_order or within
        rounding = len(untied) < sum(1 for i, x in enumerate(lists[0]) for y in lists[0][i + 1:]
                                     if lists[1].index(x) > lists[1].index(y))
        what = (f"the same {k} in the same order ({', '.join(lists[0])})" if same_order else
                f"the same {k}, in the same order but for heads that tie within rounding, compared as a tied group "
                f"({both}){swaps}" if within and rounding else
                f"the same {k} ({both}){swaps}" if within else f"the same {k} in another order ({both})")
    else:
        shared = [h for h in lists[0] if h in lists[1]]
        agree = _edge_explains(lists, tie) and (same_order or within) and any(t.edge for t in tie)
        edge, noisy = ("", False) if agree else _edge_noise(method, lists, sums, runs)
        edge_words = (f"; the others differ only within the runs' noise: {edge}" if edge and noisy else
                      f"; at the edge of the top {k or 'k'}: {edge}" if edge else "")
        agree = agree or (noisy and (same_order or within))
        what = (f"{len(shared)} of the {top} are shared" + (f" ({', '.join(shared)})" if shared else "") + f": {both}"
                + swaps + ("; the others differ only where a tie at the edge leaves a place undecided"
                           if agree and not edge else "") + edge_words)
    text = f"Top heads by {FINDING_METHOD_WORDS.get(method, method)}: {what}"
    if sums[0].get("n_examples") != sums[1].get("n_examples"):
        text += f" ({n_words(*sums)})"
    text += "." + ("" if not said else " " + "; ".join(s[0].upper() + s[1:] if i == 0 else s
                                                           for i, s in enumerate(said)) + ".")
    return (SAME if agree else "") + text


def top_heads_notes(a: Run, b: Run, *, said: set[str] = frozenset()) -> list[str]:
    """One note per importance method either heads summary lists top heads for (the order the summaries list
    them), `said` methods left out (their refusal is already on the page): not compared where the runs ran heads on
    other tasks, are models of other sizes, a method only one run lists, or either report does not rank its heads
    (refuses_to_rank); otherwise compared as a set and in order, with each recorded tie said (_top_note). Agreement,
    up to ties, is SAME."""
    lists = [top_lists(a), top_lists(b)]
    methods = [m for m in dict.fromkeys([*lists[0], *lists[1]]) if m not in said]
    if not methods:
        return []
    other_task = tasks_differ(a, b, "heads")
    sums = [a.summary("heads") or {}, b.summary("heads") or {}]
    if other_task:
        return [NOT_COMPARED + f"Top heads: not compared: {other_task}."]
    sizes = [s.get("n_heads") for s in sums]
    if all(isinstance(n, int) for n in sizes) and sizes[0] != sizes[1]:
        return [NOT_COMPARED + f"Top heads: not compared: {models_differ(a, b) or 'the models differ in size'}; "
                "a head's name is a different head in each."]
    notes = []
    for method in methods:
        words = FINDING_METHOD_WORDS.get(method, method)
        if method not in lists[0] or method not in lists[1]:
            side = SIDES[0] if method in lists[0] else SIDES[1]
            notes.append(NOT_COMPARED + f"Top heads by {words}: only {side}'s heads analysis ran this method.")
            continue
        refusals = [refuses_to_rank(r, method) for r in (a, b)]
        if any(refusals) or not (lists[0][method] and lists[1][method]):
            why = "; ".join(f"{side} {r}" for side, r in zip(SIDES, refusals) if r) or "a report lists none"
            notes.append(NOT_COMPARED + f"Top heads by {words}: not compared, because {why}, so "
                         f"{'neither report ranks' if all(refusals) else 'that report does not rank'} its heads by it.")
            continue
        notes.append(_top_note(method, [lists[0][method], lists[1][method]], sums, (a, b)))
    return notes
