"""Figures of the `position` analysis: the U-curve, attention onto the gold span, sink mass.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy
tables, summary values by keyword; `figures(result)` gives every figure by file stem. Plotting
reads the Result's tables only; nothing is computed from the model here.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from headscope.errors import ConfigError
from headscope.reports.findings import _chance, _ci, _num, ci_pair, int_ranges, sink_sentence
from headscope.reports.plots import axes, color_scale, fit_labels, hatch_cells, line_colours, quiet_reason

LABELS = {"accuracy": "accuracy (greedy output contains the value)", "logprob": "answer log-probability (nats)",
          "probability": "answer probability", "rank": "answer rank", "exact": "exact greedy answer",
          "cosine": "cosine(query, passage)"}


SHARES = ("accuracy", "probability", "exact")  # metrics in 0-1, drawn on a 0-1 axis
# position_streaming's reference: what a window that keeps nothing of the gold item can at best fall back to
STREAMING_BASELINE = "no gold item in the prompt\n(full attention, 95% band)"
MARKERS = ("o", "s", "^", "D", "v", "P")
DASHES = ("-", "--", ":", "-.")


def plot_curve(data: pd.DataFrame, *, metric: str | None = None, conditions: tuple[str, ...] = ("full",),
               n_items: int | None = None, ratio: float | None = None, title: str | None = None,
               quiet: bool = False, no_gold: Mapping[str, Any] | None = None,
               no_gold_label: str = "no gold item (95% band)", ax: Any = None) -> Any:
    """Metric against gold position (1-based slot) with its 95% band (`data`: the curve table; exact
    Clopper-Pearson for accuracy, bootstrap otherwise; metric: its first when None): the U-curve. The
    default title gives `ratio`, min(middle) / max(ends) (the summary's ratio_middle_to_ends), or says
    the curve is flat. Shares (accuracy, probability) on a 0-1 axis; `quiet` (the model at chance,
    plots.quiet_reason) draws the lines in muted colours (plots.line_colours). `no_gold` (the summary's
    no_gold_baseline entry of this metric: mean and ci) is drawn as a grey horizontal line with its 95% band:
    Liu et al.'s baseline without the gold item, which a position beats only where the bands separate
    (`no_gold_label`: its legend entry)."""
    ax = axes(ax, (6, 4))
    curve = data
    metric = metric or str(curve["metric"].iloc[0])
    data = curve[(curve["metric"] == metric) & curve["condition"].isin(conditions)]
    if data.empty:
        raise ConfigError(f"no curve for metric {metric!r} and conditions {conditions}; "
                          f"metrics: {sorted(curve['metric'].unique())}.")
    palette = line_colours(len(conditions), quiet=quiet)
    for i, (color, (cond, g)) in enumerate(zip(palette, data.groupby("condition", sort=False))):
        g = g.sort_values("position")  # each condition its own marker and dash: equal curves stay visible
        ax.plot(g["position"], g["mean"], color=color, label=cond, marker=MARKERS[i % len(MARKERS)],
                linestyle=DASHES[i % len(DASHES)], markersize=7 - i % 3, linewidth=2.2 - 0.5 * (i % 3))
        ax.fill_between(g["position"], g["ci_low"], g["ci_high"], color=color, alpha=0.2)
    base = _num((no_gold or {}).get("mean"))
    if base is not None:
        ax.axhline(base, color="0.35", linestyle=(0, (4, 2)), linewidth=1.4, label=no_gold_label, zorder=1)
        low, high = ((no_gold or {}).get("ci") or [None, None])[:2]
        if _num(low) is not None and _num(high) is not None:
            ax.axhspan(low, high, color="0.6", alpha=0.25, linewidth=0, zorder=0)
    ax.set_xticks(sorted(data["position"].unique()))
    ax.set_xlabel(f"gold position (of {n_items if n_items is not None else '?'})")
    ax.set_ylabel(LABELS.get(metric, metric))
    if metric in SHARES:  # a share: its whole range, so a band of 0/8 reads as what it is
        ax.set_ylim(-0.02, 1.02)
    lo, hi = float(data["mean"].min()), float(data["mean"].max())
    if title is None and hi - lo < 0.02:
        title = f"flat: {metric} {lo:.2f}-{hi:.2f} at every gold position (no measurable effect of position)"
    elif title is None:
        title = "min(middle) / max(ends) = " + (f"{ratio:.2f}" if ratio is not None else "n/a (too few positions)")
        title += _verdict(data[data["condition"] == conditions[0]])
    ax.set_title(title, fontsize="medium")
    if len(conditions) > 1 or base is not None:
        ax.legend(title="attention" if len(conditions) > 1 else None, loc="upper left", bbox_to_anchor=(1.01, 1),
                  fontsize="small")
    return ax


def _verdict(curve: pd.DataFrame) -> str:
    """What the bands allow: a U-shape only when the worst middle position's band lies below both ends'."""
    g = curve.sort_values("position")
    if len(g) < 3:
        return ""
    first, last, middle = g.iloc[0], g.iloc[-1], g.iloc[1:-1]
    worst = middle.loc[middle["mean"].idxmin()]
    if worst["ci_high"] < first["ci_low"] and worst["ci_high"] < last["ci_low"]:
        return "\nU-shape: the middle's 95% band lies below both ends'"
    return "\n95% bands of the middle and an end overlap: no U-shape shown"


def plot_gold_attention(data: pd.DataFrame, *, reduce: str = "max", quiet: str | None = None, ax: Any = None,
                        every_query: bool = False) -> Any:
    """Heat map layer x gold position of the attention mass onto the gold span (`data`: the
    gold_attention table; max or mean over heads), on the sequential map from 0 (plots.color_scale);
    `quiet` (plots.quiet_reason: the model at chance, so no head retrieves anything) mutes it and says why. A cell
    whose gold span the answer query sees in no example (the table's `visible` 0: a sliding window leaves it behind,
    analyses.position.gold_visible) is 0 by the mask, not measured: hatched grey, without a number, and the title
    says so (review 14c B1). `every_query`: the mass is a mean over every query token (an encoder's retrieval run,
    which has no answer position: review 19d C2), as the title then says."""
    ax = axes(ax, (6, 4))
    table = data
    grid = table.groupby(["layer", "position"])["mass"].agg(reduce).unstack("position")  # [layer, position]
    hidden = np.zeros(grid.shape, dtype=bool)  # [layer, position]
    if "visible" in table:
        seen = table.groupby(["layer", "position"])["visible"].max().unstack("position").reindex_like(grid)
        hidden = (seen == 0).to_numpy()
    measured = grid.to_numpy(dtype=float)[~hidden]
    sns.heatmap(grid, ax=ax, **color_scale(measured if measured.size else np.zeros(1), quiet=bool(quiet), is_signed=False),
                annot=grid.shape[1] <= 10, fmt=".2f", mask=hidden, cbar_kws={"label": "attention mass (0-1)"})
    hatch_cells(ax, hidden)
    ax.set_xlabel("gold position")
    ax.set_ylabel("layer")
    said = ("\nhatched: gold span outside the answer query's sliding window in every example (0 by the mask, not "
            "measured)" if hidden.any() else "")
    rows = ", mean over every query token" if every_query else ""
    ax.set_title(f"attention onto the gold span{rows} ({reduce} over heads)" + said + (f"\n{quiet}" if quiet else ""))
    return ax


def plot_sink_mass(data: pd.DataFrame, *, n_sink: int | None = None, what: str | None = None, ax: Any = None,
                   baseline_kind: str | None = None) -> Any:
    """Per layer, the mass on the first `n_sink` tokens (`data`: the sinks table; `what`: those tokens in words,
    the summary's sink_label on encoders), against the uniform baseline, each bar with the 95% t interval over
    examples the finding quotes (ci_low / ci_high: sinks.layer_sinks), where the table has it; the legend says
    so, or the title that none is recorded (review 16c C3: one short title line; the detail in the legend and the
    caption). baseline_kind "alibi": the dashed line is ALiBi's bias alone (the summary's sink_baseline). The y
    label takes two short lines, so it stays below the title."""
    ax = axes(ax, (6, 4))
    sinks = data
    x = np.arange(len(sinks))  # [layer]
    mass = sinks["sink_mass"].to_numpy(dtype=float)  # [layer]
    err = None
    if {"ci_low", "ci_high"} <= set(sinks) and sinks[["ci_low", "ci_high"]].notna().all().all():
        low, high = sinks["ci_low"].to_numpy(dtype=float), sinks["ci_high"].to_numpy(dtype=float)
        err = np.stack([np.clip(mass - low, 0, None), np.clip(high - mass, 0, None)])  # [2, layer]: ends at low, high
    ax.bar(x, mass, width=0.8, color=sns.color_palette()[0], yerr=err, capsize=4, ecolor="black",
           error_kw={"elinewidth": 1},
           label="measured (error bars:\n95% t interval of the\nmean over examples)" if err is not None else "measured")
    ax.set_xticks(x, [str(int(v)) for v in sinks["layer"]])
    ax.set_xlabel("layer")
    base = sinks["baseline"].to_numpy(dtype=float)  # [layer]: each layer's own (a sliding window sees fewer keys)
    baseline = float(base.max())
    named = ("ALiBi's bias alone\n(equal scores)" if baseline_kind == "alibi" else  # review 19b B1: learned sinks
             "uniform attention over\nthe mass reaching the keys" if baseline_kind == "keys" else "uniform attention")
    if base.max() - base.min() < 1e-9:
        ax.axhline(baseline, color="black", linestyle="--", label=named)
    else:
        ax.hlines(base, x - 0.4, x + 0.4, color="black", linestyle="--", label=f"{named}\n(per layer: its visible keys)")
    what = what or f"the first {n_sink if n_sink is not None else '?'} token(s)"
    ax.set_ylabel(f"attention mass (0-1)\non {what.split(' (')[0]}")
    top = float(np.nanmax(mass + (err[1] if err is not None else 0)))
    ax.set_ylim(0, min(1.0, 1.25 * max(top, baseline)) or 1.0)  # bars and their intervals fill the axis
    copies = "n_distinct" in sinks and bool((sinks["n_distinct"] == 1).all()) and err is None  # review 17c B1
    ax.set_title("attention sink per layer" + ("" if err is not None else " (no interval: the examples are copies)"
                                               if copies else " (no interval recorded)"))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return ax


def figures(result: Any, **kwargs: Any) -> dict[str, Any]:
    """{file stem: Figure}: position_curve, position_gold_attention, position_sinks (+ position_streaming)."""
    s, tables = result.summary, result.tables
    primary = s.get("primary_metric", "accuracy")
    common = {"n_items": s.get("n_items"), "ratio": (s.get("ratio_middle_to_ends") or {}).get(primary)}
    figs = {}
    quiet = quiet_reason(s)  # at chance: a flat curve is a floor, not evidence about position
    curve_title = None if quiet is None else f"{primary} by gold position\n{quiet}"
    no_gold = (s.get("no_gold_baseline") or {}).get(primary)
    for stem, draw in (("position_curve", lambda ax: plot_curve(tables["curve"], metric=primary, ax=ax, title=curve_title,
                                                                   quiet=quiet is not None, no_gold=no_gold, **common)),
                       ("position_gold_attention", lambda ax: plot_gold_attention(tables["gold_attention"], ax=ax,
                                                                                           quiet=quiet_reason(s),
                                                                                           every_query=_every_query(s))),
                       ("position_sinks", lambda ax: plot_sink_mass(tables["sinks"], n_sink=s.get("n_sink"),
                                                                  what=s.get("sink_label"), ax=ax,
                                                                  baseline_kind=s.get("sink_baseline")))):
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax)
        fig.tight_layout()
        fit_labels(ax)
        figs[stem] = fig
    masked = tables.get("masked", pd.DataFrame())
    if len(masked):
        fig, ax = plt.subplots(figsize=(8, 4))
        # the reference a window is judged against: the answer's log-probability with the gold item gone altogether
        plot_curve(tables["curve"], metric="logprob", conditions=("full", *masked["condition"].unique()),
                   n_items=s.get("n_items"), ax=ax, title="full context vs streaming windows (sinks + recent tokens)"
                   + (f"\n{quiet}" if quiet else ""), quiet=quiet is not None,
                   no_gold=(s.get("no_gold_baseline") or {}).get("logprob"), no_gold_label=STREAMING_BASELINE)
        fig.tight_layout()
        fit_labels(ax)
        figs["position_streaming"] = fig
    return figs


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "Lost in the middle: answer quality against the position of the relevant item in the context "
    "(Liu et al. 2023), with bootstrap intervals. A U-shape means the middle is neglected. The "
    "attention maps show which heads look at the gold item, and the sink panel shows how much "
    "attention parks on the first tokens against the uniform baseline."
)
ALIBI_SINK_BASELINE = ("against the share ALiBi's position bias alone gives them with every score equal (this model's "
                       "positions are ALiBi's, not uniform attention)")


def guide_for(summary: Mapping[str, Any]) -> str:
    """The guide for this run: on an ALiBi model the sink panel's baseline is ALiBi's closed-form share
    (summary sink_baseline "alibi"; models.alibi.first_key_share), not uniform attention (review 16c B1)."""
    if summary.get("sink_baseline") == "alibi":
        return GUIDE.replace("against the uniform baseline", ALIBI_SINK_BASELINE, 1)
    return GUIDE


def _every_query(summary: Any) -> bool:
    """An encoder's retrieval run: its gold mass is averaged over every query token (runs.AttentionStats)."""
    return isinstance(summary, Mapping) and summary.get("task") == "retrieval"


GOLD_FROM = "from the answer position"
GOLD_EVERY = "averaged over every query token (an encoder has no answer position)"


def caption_for(stem: str, summary: Mapping[str, Any] | None) -> str | None:
    """A figure's caption for this run where it depends on it, else None (CAPTIONS' holds): on an encoder's retrieval
    run the gold attention is worded from what was computed, a mean over every query token (review 19d C2)."""
    if stem == "position_gold_attention" and _every_query(summary):
        return CAPTIONS[stem].replace(GOLD_FROM, GOLD_EVERY)
    return None


CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "position_curve": "Answer metric (y) by the gold item's slot in the context (x), 95% band over examples (accuracy: "
                      "exact Clopper-Pearson; other metrics: bootstrap). "
                      "The middle is neglected only where its band lies below both ends' bands; overlapping bands show "
                      "no difference at this sample size. The grey dashed line and band: the same metric on each "
                      "example's prompt without the gold item (the same distractors; Liu et al.'s no-gold baseline, 95% "
                      "band); a position beats it only where its band lies above the grey band.",
    "position_gold_attention": "Attention mass (0-1) on the gold span from the answer position, layer x gold position, max "
                               "over heads. Hatched grey cells: on a sliding-window layer the gold span lies outside the "
                               "answer query's window in every example, so the mass there is 0 by the mask, not measured.",
    "position_sinks": "Per layer, attention mass on the first tokens (0-1) against the uniform-attention baseline (dashed; "
                      "a sliding-window layer's counts only the keys inside its window; on an ALiBi model the share its "
                      "position bias alone gives them with every score equal), each bar with the 95% t interval "
                      "of its mean over examples that the finding quotes. On a sliding-window layer the bar averages only "
                      "the queries whose window holds the first token; where those queries read the same first tokens "
                      "in several examples, the examples are copies of one input and the interval is over the distinct "
                      "inputs (none with one).",
    "position_streaming": "Answer log-probability (nats) by gold position with the full context and with streaming "
                          "windows (sinks + recent tokens); each condition has its own marker and dash, so equal curves "
                          "stay visible. The grey dashed line and band: the log-probability on each example's prompt "
                          "without the gold item, full attention (Liu et al.'s no-gold baseline, 95% band), what the "
                          "answer gets with nothing of the gold item kept; a window whose curve falls into it keeps "
                          "nothing useful at that position.",
}


METRIC_WORDS = {"cosine": "cosine with the query"}  # review 13c A4: a metric as the finding names it
FLAT = 0.02  # a curve whose values span less than this (in its own units) is called flat


def finding(s: Mapping[str, Any]) -> str:
    """The position curve (U-shape or flat), the sink mass and retrieval heads (each with its test). At
    chance: the flat curve or what was measured, and the sinks (a property of the attention, not the task);
    no shape, no ranking of positions and no retrieval head."""
    parts = []
    metric = s.get("primary_metric", "accuracy")
    per_pos = s.get("metric_per_position", {}).get(metric, {})
    values = {k: _num(v) for k, v in per_pos.items() if _num(v) is not None}
    at_chance = _chance(s) is not None
    said = METRIC_WORDS.get(metric, metric)
    if values:
        lo, hi = min(values.values()), max(values.values())
        worst = min(values, key=lambda k: values[k])
        if hi - lo < FLAT and at_chance:
            parts.append(f"The {said} curve is flat at the model's floor ({lo:.2f}-{hi:.2f} over {len(values)} gold "
                         "positions): the model does not do this task at any position, so the sweep says nothing "
                         "about position.")
        elif at_chance:
            parts.append(f"Measured: {metric} at {len(values)} gold positions over {s.get('n_examples', '?')} examples; "
                         "at chance its differences between positions are not read.")
        elif hi - lo < FLAT:
            ceiling = " at its ceiling" if metric in ("accuracy", "probability", "cosine") and lo >= 0.98 else ""
            parts.append(f"The {said} curve is flat{ceiling} ({lo:.2f}-{hi:.2f} over {len(values)} gold positions): "
                         "position in the context makes no measurable difference on this task, so this sweep "
                         "cannot show lost-in-the-middle.")
        else:
            parts.append(f"{said[:1].upper() + said[1:]} ranges from {lo:.2f} (gold at position {worst}) to {hi:.2f} "
                         f"over {len(values)} gold positions ({s.get('n_examples', '?')} examples).")
    ratio = _num(s.get("ratio_middle_to_ends", {}).get(metric))
    if ratio is not None and values and max(values.values()) - min(values.values()) >= FLAT and not at_chance:
        parts.append(f"The worst middle position reaches {ratio:.2f} of the best end. "
                     + _shape(values, (s.get("ci_per_position") or {}).get(metric) or {}, s.get("n_examples")))
    if values and not at_chance:
        said = no_gold_sentence(s, metric)
        parts += [said] if said else []
    sinks = [v for v in (_num(x) for x in s.get("sink_mass_per_layer", [])) if v is not None]
    base = _num(s.get("sink_baseline_share", s.get("sink_uniform_baseline")))  # old runs: the old name
    binding, loose = windows_that_bind(s)
    shared = sink_sentence(s.get("sinks"), n_sink=s.get("n_sink"), task=s.get("task"), unit="examples",
                           what=s.get("sink_label"), windowed=binding, baseline=s.get("sink_baseline"),
                           nope=s.get("nope_layers") or ())  # review 19c B2
    if shared:  # the kv finding's criterion, with intervals over examples
        parts.append(shared)
        if loose:
            widths = sorted({int(w) for w in loose.values()})
            parts.append(f"Sliding-window layer{'s' if len(loose) > 1 else ''} {int_ranges(sorted(map(int, loose)))} "
                         f"(window {', '.join(map(str, widths))} tokens) hold{'' if len(loose) > 1 else 's'} every "
                         f"prompt whole (the longest has {s['prompt_tokens']} tokens): their window never binds here.")
    elif sinks and base is not None:
        top = max(range(len(sinks)), key=lambda i: sinks[i])
        where = f"On {s['task']} prompts, attention" if s.get("task") else "Attention"
        what = s.get("sink_label") or f"the first {s.get('n_sink', '?')} token(s)"
        parts.append(f"{where} on {what} peaks at {sinks[top]:.2f} in layer {top} "
                     f"against {base:.2f} under uniform attention"
                     + (" (an attention sink)." if sinks[top] > 2 * base else ": no attention sink."))
    said = masked_gold_sentence(s)
    parts += [said] if said else []
    budget = s.get("budget") if isinstance(s.get("budget"), Mapping) else {}
    window = (budget.get("changed") or {}).get("window") if isinstance(budget.get("changed"), Mapping) else None
    if isinstance(window, (list, tuple)) and len(window) == 2 and window[1] == 0:  # review 19b C2
        parts.append("The streaming sweep (sinks + window against the window alone and the full context) was not run: "
                     "this run's time budget dropped it, so it has no result here (--budget inf runs it).")
    if not at_chance:
        said = _retrieval(s)
        parts += [said] if said else []
    return " ".join(parts)


def masked_gold_sentence(s: Mapping[str, Any]) -> str:
    """Review 14c B1: the sliding-window layers whose window leaves the gold span behind the answer query (the
    summary's gold_masked), in words: where it sees none of it in any example, its gold attention is 0 by the mask,
    not measured, and no head of that layer can attend to the gold item there; where it sees part, say so. Layers
    with the same positions are named together; '' where every span is in view or the run did not record it."""
    entry = s.get("gold_masked")
    if not isinstance(entry, Mapping) or not entry:
        return ""
    windows = {str(k): w for k, w in (s.get("sliding_windows") or {}).items()}
    groups: dict[tuple, list[int]] = {}
    for layer, where in entry.items():
        if isinstance(where, Mapping):
            key = (tuple(where.get("hidden") or ()), tuple(where.get("partial") or ()))
            groups.setdefault(key, []).append(int(layer))
    said = []
    for (hidden, partial), layers in groups.items():
        widths = sorted({int(windows[str(l)]) for l in layers if _num(windows.get(str(l))) is not None})
        who = (f"layer{'s' if len(layers) > 1 else ''} {int_ranges(sorted(layers))}"
               + (f" (sliding window of {', '.join(map(str, widths))} keys)" if widths else ""))
        bits = []
        if hidden:
            bits.append(f"sees none of the gold span at gold position{'s' if len(hidden) > 1 else ''} "
                        f"{int_ranges(list(hidden))} in any example: the gold attention there is 0 by the mask, not "
                        f"measured, and no head of {'those layers' if len(layers) > 1 else 'that layer'} can attend to "
                        "the gold item there")
        if partial:
            bits.append(f"sees only part of the span at {int_ranges(list(partial))} in some examples")
        if bits:
            said.append(f"On {who}, the answer position " + "; it ".join(bits) + ".")
    return " ".join(said)


def windows_that_bind(s: Mapping[str, Any]) -> tuple[list[int], dict[str, int]]:
    """(the sliding-window layers whose window is shorter than the longest prompt, so that some query of it loses the
    first token: models.visible_keys, a query q sees key 0 only when q < window; {layer: window} of those whose window
    holds every prompt whole) from the summary's sliding_windows and prompt_tokens. A summary without prompt_tokens
    (an older run) counts every sliding-window layer as binding."""
    windows = {str(k): w for k, w in (s.get("sliding_windows") or {}).items() if _num(w) is not None}
    longest = _num(s.get("prompt_tokens"))
    if longest is None:
        return sorted(int(k) for k in windows), {}
    return (sorted(int(k) for k, w in windows.items() if w < longest),
            {k: int(w) for k, w in windows.items() if w >= longest})


GOLD_ITEM = {"retrieval": "relevant sentence", "qa": "gold document", "zoo_kv": "gold pair", "json_kv": "gold pair",
             "word_kv": "gold pair"}  # what the no-gold prompt leaves out, by task


def no_gold_sentence(s: Mapping[str, Any], metric: str) -> str:
    """Liu et al.'s no-gold (closed-book) baseline in words: the metric without the gold item, its 95% interval and
    n, and which gold positions lie above it, by their intervals (summary["no_gold_baseline"]: a position is above
    only when its interval clears the baseline's; overlapping intervals show no help from the gold item there).
    '' where the run measured no baseline (a custom sweep, an older run)."""
    b = (s.get("no_gold_baseline") or {}).get(metric)
    mean = _num(b.get("mean")) if isinstance(b, Mapping) else None
    if mean is None:
        return ""
    item = GOLD_ITEM.get(str(s.get("task")), "gold item")
    kind = "exact" if b.get("interval") == "clopper-pearson" else "bootstrap"
    ci = b.get("ci") or [None, None]
    bounds = f" (95% {kind} CI [{ci[0]:.2f}, {ci[1]:.2f}], n = {b.get('n', '?')} examples)" if all(
        _num(x) is not None for x in ci) else f" (no interval, n = {b.get('n', '?')} examples)"
    head = (f"Without the {item} (the same distractors in the same order: Liu et al.'s no-gold baseline), the {metric} "
            f"is {mean:.2f}{bounds}")
    above, overlap, below = (list(b.get(k) or []) for k in ("above", "overlap", "below"))
    if not any(_num(x) is not None for x in ci):
        return head + ": no position is compared with it."
    total = len(above) + len(overlap) + len(below)
    if above and len(above) == total:
        return head + f"; every gold position's 95% interval lies above it: the {item} helps at every position."
    said = []
    if above:
        said.append(f"gold position{'s' if len(above) > 1 else ''} {int_ranges(above)} lie{'' if len(above) > 1 else 's'} "
                    "above it (the 95% intervals separate)")
    if overlap:
        said.append(f"at {int_ranges(overlap)} the intervals overlap it: no evidence that the {item} helps there at this "
                    "sample size")
    if below:
        said.append(f"at {int_ranges(below)} the {metric} lies below it (the {item} there lowers it)")
    if not above:
        said.insert(0, "no gold position's 95% interval lies above it")
    return head + "; " + "; ".join(said) + "."


def _retrieval(s: Mapping[str, Any]) -> str:
    """The retrieval heads that pass the summary's retrieval_test (analyses/position/stats.head_tracking),
    each with r, its 95% CI and adjusted p, and the test's n (examples, and the rows they hold), or that
    none passes at that n. An older summary whose test counted rows as independent (no n_examples) is said
    to be one; without any test: its flagged heads, said to be untested."""
    test, tracked = s.get("retrieval_test"), s.get("retrieval_tracked_metric", "metric")
    if not isinstance(test, Mapping):
        heads = s.get("retrieval_heads") or []
        if not heads:
            return ""
        names = ", ".join(f"L{l}H{h}" for l, h in heads[:4]) + (", ..." if len(heads) > 4 else "")
        return f"{len(heads)} head(s) were flagged as tracking the {tracked} by a threshold without a test: {names}."
    rows, tested = test.get("n_rows", "?"), test.get("n_heads", "?")
    how = f"{test.get('correction', 'holm').capitalize()}-corrected across {tested} heads"
    passed = [h for h in test.get("heads") or [] if isinstance(h, Mapping) and _num(h.get("r")) is not None]
    more = ", ..." if len(passed) > 4 else ""
    if "n_examples" not in test:  # an older run: rows of one example counted as independent
        said = [f"L{h['layer']}H{h['head']} (r = {h['r']:.2f}, adjusted p = {h.get('p_holm', float('nan')):.2g})"
                for h in passed[:4]]
        head = (f"{len(passed)} head(s) passed" if passed else "No head passed")
        return (f"{head} this run's older retrieval-head test ({how}), which counted its n = {rows} rows of examples x "
                "positions as independent although an example's rows share its prompt, so its p-values and intervals "
                "are too narrow" + (": " + ", ".join(said) + more + "." if passed else "."))
    n = f"n = {test['n_examples']} examples, {rows} rows of examples x positions; tests and intervals over examples"
    if not passed:
        return (f"No head's gold-span attention tracks the {tracked} with its mass above the other heads' "
                f"({how}, {n}): no retrieval head is named.")
    said = [f"L{h['layer']}H{h['head']} (r = {h['r']:.2f}{_ci(h.get('ci'))}, adjusted p = "
            f"{h.get('p_holm', float('nan')):.2g})" for h in passed[:4]]
    nope = {int(x) for x in s.get("nope_layers") or ()}  # review 19c B2: heads on layers without rotary, named
    on = [f"L{h['layer']}H{h['head']}" for h in passed[:4] if h.get("layer") in nope]
    return (f"{len(passed)} retrieval head(s) track the {tracked}, with gold-span mass above the other heads' ({how}, "
            f"{n}): " + ", ".join(said) + more + "." + (f" {', '.join(on)} {'are' if len(on) > 1 else 'is'} on a layer "
                                                         "without rotary (NoPE), which has no position encoding of its "
                                                         "own (positions reach it through the causal mask and the "
                                                         "residual stream)." if on else ""))


def _shape(values: Mapping[str, float], ci: Mapping[str, Any], n: Any) -> str:
    """What the bootstrap intervals allow about the middle against the ends: a U-shape only when the
    worst middle position's interval lies below both ends' intervals."""
    order = sorted(values, key=lambda k: float(k))
    middle = [k for k in order[1:-1]]
    if not middle:
        return ""
    worst = min(middle, key=lambda k: values[k])
    bounds = {k: ci.get(k) for k in (order[0], worst, order[-1])}
    if not all(ci_pair(b) for b in bounds.values()):
        return "No intervals to test the shape: no U-shape is claimed."
    size = f"n = {n} examples per position" if n is not None else "n unknown"
    below = [end for end, name in ((order[0], "first"), (order[-1], "last")) if bounds[worst][1] < bounds[end][0]]
    if len(below) == 2:
        return (f"Its 95% interval [{bounds[worst][0]:.2f}, {bounds[worst][1]:.2f}] lies below both ends' ({size}): "
                "a U-shape, the middle is neglected.")
    if below:
        which = "first" if below[0] == order[0] else "last"
        return (f"Its 95% interval lies below the {which} end's only ({size}): a decline toward the other end, "
                "not a U-shape.")
    return (f"Its 95% interval overlaps both ends' ({size}): no evidence that the middle is neglected at this "
            "sample size.")
