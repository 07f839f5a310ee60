"""Cost models and time budgets: what an analysis will cost before it runs, and settings that fit.

The unit is a *row pass*: one forward pass of one example (at the task's length) through the
whole model, without gradients; a backward pass counts two more. Each family declares
`COST = CostModel(estimate, knobs)` beside its NEEDS: `estimate(model, task, config) -> Cost`
counts the row passes of each part of the analysis from the model's shape, the task's size and
the settings (an upper bound: resumed passes that skip early blocks count as whole passes), and
`knobs` are the family's sweeps in the order they give way: fewer random orderings, L0 steps,
integration steps, causal-tracing samples, examples... Each knob maps a config to a smaller one,
or None when it has nothing left to give; a knob's optional `regrow(fitted, original)` gives back what it took
(a config or a list of candidates), which `fit` does cheapest first once every cut is made.

`seconds_per_pass(model, n_pos)` is one row pass's flops times the seconds per flop of a pass
timed on this machine at about that length, so an estimate becomes seconds (plus `Cost.extra_s`,
time no pass counts, such as probes' scikit-learn fits); `fit` applies knobs in order until the
estimate fits a budget and records every setting it changed; `allocate` shares a report's budget between its
analyses (each gets what it needs when the sum fits; otherwise the costly ones are cut to an equal
share of what is left, heads and patching, the report's first two sections, a double share).
The report's budget is `--budget` minutes, by default REPORT_MINUTES
(QUICK_MINUTES with --quick); the summary of each analysis records its budget, its estimate and
the settings the budget changed (`summary["budget"]`); manifest.json's "budget" records per analysis its share,
its estimate and the timed pass it rests on (`speed_record`): the settings a budget picks depend on the machine's
speed at the start of the run, so another run of the same command may fit differently (`--budget inf` runs
every preset in full), and the report says so in each section the budget changed (reports/provenance.py).
"""
from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from headscope.errors import ConfigError

log = logging.getLogger(__name__)

REPORT_MINUTES, QUICK_MINUTES = 10.0, 3.0  # the report's default budgets (full, --quick)
OVERHEAD = 0.15  # of a report's budget kept for what no estimate counts: loading, figures, the HTML
OVERHEAD_PER_ANALYSIS_S = 5.0  # or this much per analysis when more (figures and files take seconds whatever
# the budget: GPT-2 small's quick report spent 33 s of its 3 minutes outside its 8 analyses' runs)
MIN_EXAMPLES = 8  # the examples knob stops here
SPARE_ROUNDS, SPARE_MIN = 3, 0.02  # rounds handing a report's unused seconds to the analyses it cut, while
# at least this share of the budget is unused
STEP_POSITIONS = 16  # a one-token decode step's cost, in positions of a row pass (per-pass overhead)


@dataclass(frozen=True)
class Cost:
    """Row passes per part of an analysis (see the module doc), at sequences of n_pos tokens."""

    parts: Mapping[str, float]
    n_pos: int
    extra_s: float = 0.0  # seconds no row pass counts (probes' scikit-learn fits), timed on this machine

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))


Knob = Callable[[Any, Any], Any]  # (config, model) -> a cheaper config, or None when it has nothing left to give


@dataclass(frozen=True)
class CostModel:
    """A family's cost: estimate(model, task or None, config) -> Cost, and its knobs in the order they give way."""

    estimate: Callable[[Any, Any, Any], Cost]
    knobs: Sequence[Knob] = ()
    weight: float = 1.0  # its claim on a shared budget against the other costly analyses
    check: Callable[[Any, Any, Any], bool] | None = None  # (model, task, config) -> whether a knob's cut can run
    # (position: its prompts fit the context); fit takes no cut that fails it, so a budget never fails a run


@dataclass(frozen=True)
class Fitted:
    """A config fitted to a budget: the estimate (row passes and seconds) and what changed ({setting: [old, new]})."""

    config: Any
    cost: Cost
    seconds: float
    budget_s: float | None
    changed: dict[str, list[Any]] = field(default_factory=dict)
    speed: dict[str, Any] | None = None  # the timed pass the seconds came from (speed_record), None if none was timed
    below_quick: dict[str, list[int]] = field(default_factory=dict)  # {"n_examples": [this run's, --quick's]}

    def summary(self) -> dict[str, Any]:
        """What summary["budget"] records: the estimate in row passes (the machine's speed left out, so
        that a rerun with the same settings writes the same summary), every setting that changed, and
        below_quick where a run without --quick was cut to fewer examples than --quick runs (review 11b C3)."""
        return {"estimated_row_passes": round(self.cost.total), "parts": {k: round(v) for k, v in self.cost.parts.items()},
                "changed": self.changed, **({"below_quick": self.below_quick} if self.below_quick else {})}

    def timing(self) -> dict[str, Any]:
        """What manifest.json's "budget" records per analysis: its share, its estimate in seconds and the speed
        they rest on (speed_record: review 10a A2, a budgeted report's contents depend on a pass timed at the start
        of the run, which another run need not reproduce)."""
        return {"budget_s": None if self.budget_s is None else round(self.budget_s, 1), "estimated_s": round(self.seconds, 1),
                **({"speed": self.speed} if self.speed else {})}


# ---- measuring ------------------------------------------------------------------------------
_MEASURED: weakref.WeakKeyDictionary[Any, dict[int, float]] = weakref.WeakKeyDictionary()  # model -> {length: s per flop}
MEASURE_LENGTH = 64  # the longest timed pass; longer passes scale by their flops
MEASURE_TOKENS = 256  # tokens of a timed pass: 4 rows of 64 tokens, 16 of 16


def flops_per_row(model, n_pos: int) -> float:
    """Multiply-adds x 2 of one row pass of n_pos tokens: 2 per parameter per token (the unembedding
    included) and the attention scores and mixing, 4 d_model n_pos per token and layer."""
    f = model.facts
    params = sum(p.numel() for p in {id(p): p for p in model.bridge.parameters()}.values())
    return float(n_pos) * (2.0 * params + 4.0 * f.n_layers * n_pos * f.d_model)


def _rate(model, length: int) -> float:
    """Seconds per flop of one timed forward of MEASURE_TOKENS random tokens in rows of `length`
    with a no-op hook attached (the analyses' passes carry hooks, so they run through the bridge),
    after one warm-up pass at the model's first timing; measured once per model and length (the
    machine's load at that moment counts). One pass per length: on GPT-2 small each costs about a
    second, most of it the unembedding."""
    rates = _MEASURED.setdefault(model, {})
    if length not in rates:
        from headscope.hooks.sites import site

        rows = max(1, MEASURE_TOKENS // length)  # short passes batched as the engines batch them
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, int(model.facts.d_vocab), (rows, length), generator=g)
        hook = site("resid_post", model.facts.n_layers - 1)
        with torch.inference_mode():
            for _ in range(1 if rates else 2):  # the last pass is timed
                start = time.perf_counter()
                model.run_with_hooks(tokens, fwd=[(hook, lambda act, hook: None)])
                seconds = time.perf_counter() - start
        rates[length] = seconds / (rows * flops_per_row(model, length))
    return rates[length]


def _timed_length(model, n_pos: int) -> int:
    """The length of the timed pass whose rate seconds_per_pass uses for n_pos tokens."""
    length = min(MEASURE_LENGTH, max(1, min(int(n_pos), int(model.facts.n_ctx))))
    return 1 << (length.bit_length() - 1)


def speed_record(model, n_pos: int) -> dict[str, Any] | None:
    """What a fit's seconds rest on, for the manifest and the report (None where no pass was timed):
    {"seconds_per_flop", "length" and "rows" of the timed pass, "pass_s" (its seconds, flops x rate), "device",
    "threads"} of the pass timed at seconds_per_pass's length for n_pos tokens (None where it cannot be had)."""
    try:
        length = _timed_length(model, n_pos)
        rate = _rate(model, length)  # measured already by the fit that asks (once per model and length)
        rows = max(1, MEASURE_TOKENS // length)
        flops = flops_per_row(model, length)
    except Exception:  # noqa: BLE001 - a record must not fail a fit (a stand-in model in a test has no facts)
        return None
    return {"seconds_per_flop": float(f"{rate:.3g}"), "length": length, "rows": rows,
            "pass_s": float(f"{rate * rows * flops:.3g}"),
            "device": str(getattr(model, "device", "cpu")), "threads": int(torch.get_num_threads())}


def seconds_per_pass(model, n_pos: int) -> float:
    """Seconds of one row pass at n_pos tokens on this machine: flops_per_row times the seconds per
    flop of a timed pass at the largest power of two up to min(n_pos, MEASURE_LENGTH) tokens. A short
    pass uses the machine less well than a long one (its fixed costs weigh more), so it is timed at
    about its own length, never longer; passes past MEASURE_LENGTH use that length's rate, so long
    contexts come out dear rather than cheap."""
    n_pos = max(1, min(int(n_pos), int(model.facts.n_ctx)))
    return _rate(model, _timed_length(model, n_pos)) * flops_per_row(model, n_pos)


# ---- fitting --------------------------------------------------------------------------------
def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return list(value) if isinstance(value, tuple) else value


def changes(before: Any, after: Any, prefix: str = "") -> dict[str, list[Any]]:
    """{setting: [old, new]} for every setting that differs between two configs of one family (nested
    configs by dotted name; one that became None, e.g. a sweep turned off, as a whole)."""
    out: dict[str, list[Any]] = {}
    for f in dataclasses.fields(before):
        a, b = getattr(before, f.name), getattr(after, f.name)
        if a == b:
            continue
        if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b) and type(a) is type(b):
            out.update(changes(a, b, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = [_json(a), _json(b)]
    return out


def fit(model, cost_model: CostModel, task: Any, config: Any, budget_s: float | None) -> Fitted:
    """`config` with the family's knobs applied in order until its estimate fits budget_s seconds
    (None: no budget, the estimate only); then what knobs with a `regrow` (examples, patching's path patching and
    site groups) can give back is given back, the cheapest fitting candidate first, while the estimate still fits:
    an early cheap cut is not lost to a later larger one that alone made the plan fit. When every knob is spent the
    last config stays, with a log line saying the budget cannot be met."""
    def seconds(c: Cost) -> float:  # a knob may shorten the passes (position's pairs) as well as cut them
        return c.total * seconds_per_pass(model, c.n_pos) + c.extra_s

    cost = cost_model.estimate(model, task, config)
    fitted = config
    if budget_s is not None:
        for knob in cost_model.knobs:
            trial = fitted  # a knob's step is kept once it lowers the estimate (halving the examples of
            while seconds(cost) > budget_s:  # a task with fewer rows changes nothing at first)
                smaller = knob(trial, model)
                if smaller is None or smaller == trial:
                    break
                if cost_model.check is not None and not cost_model.check(model, task, smaller):
                    log.info("a cut of %s would not run (%s); kept at %s", getattr(knob, "__name__", "a knob"),
                             "; ".join(f"{k} {a} -> {b}" for k, (a, b) in changes(trial, smaller).items()),
                             "its preset" if trial == config else "the last cut that runs")
                    break
                trial = smaller
                trial_cost = cost_model.estimate(model, task, trial)
                if seconds(trial_cost) < seconds(cost):
                    fitted, cost = trial, trial_cost
        while True:  # give back what a later knob's cut left room for, cheapest first (review 18d C5)
            grown = [(seconds(c), i, b, c) for i, b in enumerate(_regrown(cost_model, fitted, config))
                     if (cost_model.check is None or cost_model.check(model, task, b))
                     for c in [cost_model.estimate(model, task, b)] if seconds(c) <= budget_s]
            if not grown:
                break
            _, _, fitted, cost = min(grown, key=lambda g: (g[0], g[1]))
        if seconds(cost) > budget_s:
            log.info("the estimate %.0f s still exceeds the budget of %.0f s with every sweep at its smallest",
                     seconds(cost), budget_s)
    return Fitted(config=fitted, cost=cost, seconds=seconds(cost), budget_s=budget_s, changed=changes(config, fitted),
                  speed=speed_record(model, cost.n_pos), below_quick=_below_quick(cost_model, task, config, fitted))


def _regrown(cost_model: CostModel, fitted: Any, original: Any) -> list[Any]:
    """Every config one knob's `regrow(fitted, original)` gives back (a config, a list of them, or None when it took
    nothing), in knob order."""
    out: list[Any] = []
    for knob in cost_model.knobs:
        regrow = getattr(knob, "regrow", None)
        bigger = regrow(fitted, original) if regrow is not None else None
        out.extend(b for b in (bigger if isinstance(bigger, list) else [bigger]) if b is not None and b != fitted)
    return out


def _below_quick(cost_model: CostModel, task: Any, config: Any, fitted: Any) -> dict[str, list[int]]:
    """{"n_examples": [fitted's, the --quick preset's]} where a config without quick was fitted to fewer examples
    than the same settings with quick run (the examples knob's `counts`: the examples each would run); {} otherwise."""
    if fitted is config or getattr(config, "quick", True):
        return {}
    for knob in cost_model.knobs:
        counts = getattr(knob, "counts", None)
        if counts is not None:
            try:
                n, quick = counts(fitted, config, task)
            except (ConfigError, TypeError, ValueError):  # a config --quick cannot rebuild: nothing to compare
                return {}
            if n < quick:
                return {"n_examples": [n, quick]}
    return {}


def allocate(estimates: Mapping[str, float], budget_s: float, weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each analysis's share of budget_s: its estimate when the sum fits; otherwise the largest cap s
    with sum(min(estimate, weight x s)) = budget_s (cheap analyses keep what they need, the costly
    ones share the rest in proportion to their weights, 1 unless given)."""
    if budget_s <= 0:
        raise ConfigError(f"the budget must be positive, got {budget_s:g} s.")
    if sum(estimates.values()) <= budget_s:
        return dict(estimates)
    w = {name: float((weights or {}).get(name, 1.0)) for name in estimates}
    left, rest = budget_s, sorted(estimates, key=lambda name: estimates[name] / w[name])
    shares: dict[str, float] = {}
    while rest:
        cap = left / sum(w[name] for name in rest)  # seconds per unit of weight
        if estimates[rest[0]] > w[rest[0]] * cap:
            shares.update({name: w[name] * cap for name in rest})
            break
        shares[rest[0]] = estimates[rest[0]]
        left -= estimates[rest[0]]
        rest = rest[1:]
    return shares


def kept_back(budget_s: float, n_analyses: int) -> float:
    """Seconds of a report's budget kept for what no estimate counts (loading, figures, the HTML):
    OVERHEAD of it, or OVERHEAD_PER_ANALYSIS_S per analysis when that is more, at most half of it."""
    return max(OVERHEAD * budget_s, min(OVERHEAD_PER_ANALYSIS_S * n_analyses, budget_s / 2))


def plan(model, entries: Mapping[str, tuple[CostModel, Any, Any]], minutes: float | None) -> dict[str, Fitted]:
    """Every analysis of a run fitted to one budget of `minutes` (None or inf: estimates only).
    entries: name -> (its cost model, the Task it will run on or None, its config). `kept_back` of
    the budget is kept back; the rest is shared by `allocate`, and each analysis fitted to its share.
    Then, while SPARE_MIN of it is left unused (a knob's steps are coarse: halving the examples can
    leave half a share), up to SPARE_ROUNDS rounds add the unused seconds, by weight, to what the
    analyses the budget cut are estimated to take, and fit them again."""
    import math

    free = {}
    for name, (cm, task, config) in list(entries.items()):
        try:
            free[name] = fit(model, cm, task, config, None)
        except Exception as err:  # noqa: BLE001 - one estimate that fails leaves that analysis at its preset, not all
            log.warning("%s: no cost estimate (%s: %s); it runs at its preset", name, type(err).__name__, err)
    entries = {name: entry for name, entry in entries.items() if name in free}
    if minutes is None or math.isinf(minutes) or not entries:
        return free
    if minutes <= 0:
        raise ConfigError(f"--budget is in minutes and must be positive, got {minutes:g}.")
    budget_s = minutes * 60
    avail = budget_s - kept_back(budget_s, len(entries))
    weights = {name: cm.weight for name, (cm, _, _) in entries.items()}
    shares = allocate({name: f.seconds for name, f in free.items()}, avail, weights)
    fitted = {name: fit(model, cm, task, config, shares[name]) for name, (cm, task, config) in entries.items()}
    for _ in range(SPARE_ROUNDS):  # the knobs' steps are coarse (halved examples): hand the unused seconds on
        spare = avail - sum(f.seconds for f in fitted.values())
        cut = [name for name, f in fitted.items() if f.changed and f.seconds < free[name].seconds]
        if spare < SPARE_MIN * avail or not cut:
            break
        total_w = sum(weights[name] for name in cut)
        grown = {name: fit(model, *entries[name], fitted[name].seconds + spare * weights[name] / total_w) for name in cut}
        if all(grown[name].config == fitted[name].config for name in cut):
            break
        fitted.update({name: g for name, g in grown.items() if g.config != fitted[name].config})
    return fitted


def describe(name: str, fitted: Fitted) -> str:
    """One log line: the estimate, the budget and what it changed."""
    budget = "" if fitted.budget_s is None else f" (budget {fitted.budget_s:.0f} s)"
    changed = "; ".join(f"{k} {old} -> {new}" for k, (old, new) in fitted.changed.items())
    return (f"{name}: estimated {fitted.cost.total:,.0f} row passes of {fitted.cost.n_pos} tokens, about "
            f"{fitted.seconds:.0f} s{budget}" + (f"; the budget changed {changed}" if changed else ""))


# ---- knobs shared by the families -----------------------------------------------------------
def fewer_examples(config: Any, model: Any, *, full: int, quick: int, floor: int = MIN_EXAMPLES) -> Any:
    """Halve the examples (config.n_examples, from the family's default full/quick count), down to floor."""
    n = config.examples(full, quick)
    if n <= floor:
        return None
    return dataclasses.replace(config, n_examples=max(floor, n // 2))


def more_examples(fitted: Any, original: Any, *, full: int, quick: int) -> Any:
    """Double the examples a knob took away, up to the original count (None when nothing was taken)."""
    n, target = fitted.examples(full, quick), original.examples(full, quick)
    if n >= target:
        return None
    return dataclasses.replace(fitted, n_examples=original.n_examples if 2 * n >= target else 2 * n)


def examples_knob(full: int, quick: int, floor: int = MIN_EXAMPLES) -> Knob:
    """Halve the examples; `knob.regrow(fitted, original)` doubles them back (fit tries it once
    every knob is applied: a later knob's cut, such as heads' gradient-only last resort, may leave
    room for more examples again)."""
    def knob(config: Any, model: Any) -> Any:
        return fewer_examples(config, model, full=full, quick=quick, floor=floor)

    knob.regrow = lambda fitted, original: more_examples(fitted, original, full=full, quick=quick)  # type: ignore[attr-defined]
    knob.counts = lambda fitted, original, task: (  # type: ignore[attr-defined]
        n_rows(task, fitted, full, quick), n_rows(task, dataclasses.replace(original, quick=True), full, quick))
    return knob


def n_rows(task: Any, config: Any, full: int, quick: int) -> int:
    """The examples an analysis runs: the task's rows, at most the config's count."""
    n = config.examples(full, quick)
    return min(n, len(task)) if task is not None and hasattr(task, "__len__") else n


def resumed_share(model: Any) -> float:
    """The share of a whole pass that a run editing one layer costs where passes resume at the edited
    block (execution/resume.py; (L + 1) / 2L averaged over the layers), else 1."""
    from headscope.execution import resume

    layers = int(model.facts.n_layers)
    return (layers + 1) / (2 * layers) if resume.supports(model).ok else 1.0


def task_length(task: Any, model: Any, default: int = 64) -> int:
    """The task's padded length (default, at most the context, without a task)."""
    tokens = getattr(task, "tokens", None)
    return int(tokens.shape[1]) if tokens is not None else min(default, int(model.facts.n_ctx))


__all__ = ["Cost", "CostModel", "Fitted", "OVERHEAD", "OVERHEAD_PER_ANALYSIS_S", "QUICK_MINUTES", "REPORT_MINUTES",
           "STEP_POSITIONS", "allocate", "changes", "describe", "examples_knob", "fewer_examples", "fit", "flops_per_row",
           "kept_back", "n_rows", "plan", "resumed_share", "seconds_per_pass", "speed_record", "task_length"]
